"""The ``numba-flash`` command line and the library modules behind it.

Runs on a CPU-only machine: ``check`` in numba's CUDA simulator on tiny shapes, ``inspect``
through ``numba.cuda.compile_ptx`` (no GPU needed), ``bench`` and ``memory`` only as far
as their clean "needs a CUDA device" exit plus the pure-library parts (FLOP formula,
presets, JSON/CSV schema, plots).  Tests marked ``gpu`` time real peers on a GPU.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from numba_flash import bench as B
from numba_flash import check as C
from numba_flash import inspection as I
from numba_flash import memory as M
from numba_flash._numba_cuda import SIMULATOR

try:
    from numba_flash_cli.main import main
except ImportError:  # the project is not pip-installed: import cli/ from the checkout
    from cli.main import main

COMMANDS = ["check", "bench", "memory", "info", "inspect"]


def invoke(*args):
    result = CliRunner().invoke(main, list(args), prog_name="numba-flash", catch_exceptions=True)
    return result


def invoke_split(*args):
    """As :func:`invoke`, with ``result.stdout`` and ``result.stderr`` apart (click 8.2+
    always keeps them apart; 8.1 needs ``mix_stderr=False``)."""
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:
        runner = CliRunner()
    return runner.invoke(main, list(args), prog_name="numba-flash", catch_exceptions=True)


def assert_clean_exit(result, code):
    """Exit ``code`` through SystemExit: never an uncaught exception or a traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------------------
# --help and usage errors
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [None] + COMMANDS)
def test_help_has_an_example(command):
    args = ([command] if command else []) + ["--help"]
    result = invoke(*args)
    assert_clean_exit(result, 0)
    assert "Usage: numba-flash" in result.output
    assert "Example" in result.output and "numba-flash " + (command or "") in result.output


BAD_OPTIONS = [
    ["nonsense"],
    ["check", "--seqlen", "abc"],
    ["check", "--seqlen", "0"],
    ["check", "--seqlen", "1:2:3"],
    ["check", "--head-dim", "264"],
    ["check", "--head-dim", "512"],
    ["check", "--dtype", "float64"],
    ["check", "--causal", "maybe"],
    ["check", "--layout", "sbhd"],
    ["check", "--batch", "0"],
    ["check", "--seed", "-1"],
    ["bench", "--preset", "fa3"],
    ["bench", "--preset", "fa2", "--seqlen", "128"],
    ["bench", "--rep", "5", "--min-rep", "10"],
    ["bench", "--impl", "triton"],
    ["bench", "--budget-ms", "0"],
    ["memory", "--min-seqlen", "4096", "--max-seqlen", "1024"],
    ["memory", "--head-dim", "0"],
    ["memory", "--dtype", "int8"],
    ["inspect"],
    ["inspect", "--pass", "sideways", "--dtype", "float32", "--head-dim", "64"],
    ["inspect", "--pass", "forward", "--dtype", "float32", "--head-dim", "64", "--arch", "foo"],
    ["inspect", "--pass", "forward", "--dtype", "float32", "--head-dim", "x"],
    ["inspect", "--pass", "forward", "--dtype", "float16", "--head-dim", "64", "--tf32"],
    ["inspect", "--pass", "backward", "--dtype", "bfloat16", "--head-dim", "64", "--tf32"],
    ["info", "--verbose"],
    # --json takes a FILE (or -) everywhere: the old flag form is an error
    ["info", "--json"],
    ["inspect", "--pass", "forward", "--dtype", "float32", "--head-dim", "64", "--json"],
    ["check", "--json"],
    # only --json writes to stdout
    ["bench", "--csv", "-"],
    ["bench", "--plot", "-"],
]


@pytest.mark.parametrize("args", BAD_OPTIONS, ids=[" ".join(a) for a in BAD_OPTIONS])
def test_bad_options_are_usage_errors(args):
    result = invoke(*args)
    assert_clean_exit(result, 2)
    assert "Error" in result.output


# --------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------


needs_sim = pytest.mark.skipif(not SIMULATOR, reason="the tiny-shape check cases are for the simulator")


@needs_sim
def test_check_passes_in_the_simulator(tmp_path):
    out = tmp_path / "check.json"
    result = invoke("check", "--seqlen", "9:17", "--head-dim", "16", "--causal", "on",
                    "--dtype", "float32", "--dtype", "float16", "--seed", "3", "--json", str(out))  # fmt: skip
    assert_clean_exit(result, 0)
    first = result.output.splitlines()[0]
    assert first.startswith("numba-flash check:") and "simulator" in first and "seed 3" in first
    assert result.output.count("PASS") >= 2 + 10 and "FAIL" not in result.output
    assert "all 2 case(s) passed" in result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "numba-flash-check/1" and doc["passed"] is True and doc["seed"] == 3
    assert doc["mode"] == "simulator"
    assert [r["case"]["dtype"] for r in doc["results"]] == ["float32", "float16"]
    for r in doc["results"]:
        assert r["passed"] and r["error"] is None
        assert [o["output"] for o in r["outputs"]] == ["out", "lse", "dq", "dk", "dv"]
        for o in r["outputs"]:
            assert o["passed"] and o["rel"] <= o["limit"]
        lowp = r["case"]["dtype"] == "float16"  # LSE is float32: judged by the float32 bound, no baseline
        assert all((o["baseline_rel"] is not None) == (lowp and o["output"] != "lse") for o in r["outputs"])


def _fake_api(monkeypatch, *, error=0.0, raise_in_forward=False):
    """Replace the API with the float64 reference (+ ``error``): no kernel runs."""
    from numba_flash import api, reference

    def flash_attention(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, layout="bshd"):
        if raise_in_forward:
            raise RuntimeError("kernel exploded")
        out, lse = reference.attention(q, k, v, causal=causal, layout=layout)
        out = (out + error).astype(q.dtype)
        return (out, lse.astype(np.float32)) if return_lse else out

    def flash_attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, layout="bshd"):
        grads = reference.attention_backward(dout, q, k, v, out, lse, causal=causal, layout=layout)
        return tuple((g + error).astype(q.dtype) for g in grads)

    monkeypatch.setattr(api, "flash_attention", flash_attention)
    monkeypatch.setattr(api, "flash_attention_backward", flash_attention_backward)


def test_check_fails_on_wrong_results(monkeypatch, tmp_path):
    _fake_api(monkeypatch, error=1e-2)
    out = tmp_path / "c.json"
    result = invoke("check", "--seqlen", "7", "--head-dim", "16", "--causal", "off", "--seed", "5",
                    "--json", str(out))  # fmt: skip
    assert_clean_exit(result, 1)
    assert "FAIL" in result.output and "FAILED: 1 of 1" in result.output
    doc = json.loads(out.read_text())
    assert doc["passed"] is False
    outputs = {o["output"]: o for o in doc["results"][0]["outputs"]}
    assert not outputs["out"]["passed"] and not outputs["dq"]["passed"]
    assert outputs["lse"]["passed"]  # the fake leaves the LSE exact


def test_check_passes_with_exact_results_and_reports_errors(monkeypatch):
    _fake_api(monkeypatch, error=0.0)
    result = invoke("check", "--seqlen", "5:9", "--head-dim", "8", "--causal", "both", "--layout", "both",
                    "--seed", "1")  # fmt: skip
    assert_clean_exit(result, 0)
    assert "all 4 case(s) passed" in result.output

    _fake_api(monkeypatch, raise_in_forward=True)
    result = invoke("check", "--seqlen", "5", "--head-dim", "8", "--causal", "off", "--seed", "1")
    assert_clean_exit(result, 1)
    assert "ERROR" in result.output and "kernel exploded" in result.output


def test_no_device_and_no_simulator(monkeypatch):
    """NUMBA_ENABLE_CUDASIM=0 on a machine without a GPU: nothing can run, say so."""
    monkeypatch.setattr(C, "runtime_mode", lambda: "none")
    for args in (["check"], ["bench"], ["memory"]):
        result = invoke(*args)
        assert_clean_exit(result, 1)
        assert "CUDA device" in result.output


def test_version():
    result = invoke("--version")
    assert_clean_exit(result, 0)
    assert result.output.startswith("numba-flash ")


def test_default_simulator_grid_is_tiny():
    """Tiny (the simulator runs a thread per CUDA thread), yet every kernel family of the
    launch plan is reached (tests/test_check.py checks the families themselves)."""
    cases = C.default_cases(simulator=True)
    assert 1 <= len(cases) <= 10
    assert all(c.batch == 1 and c.heads <= 2 and max(c.seqlen_q, c.seqlen_k) <= 33 for c in cases)
    assert {c.head_dim for c in cases} <= {16, 32, 64}
    assert {c.causal for c in cases} == {False, True} and {c.layout for c in cases} == {"bshd", "bhsd"}
    assert any(c.seqlen_q < c.seqlen_k for c in cases) and any(c.seqlen_q > c.seqlen_k and c.causal for c in cases)
    assert {c.dtype for c in cases} == {"float32", "float16", "bfloat16"} and any(c.tf32 for c in cases)


def test_default_gpu_grid_covers_the_brief():
    cases = C.default_cases(simulator=False)
    assert {(c.seqlen_q, c.seqlen_k) for c in cases} >= {(1, 1), (127, 127), (1024, 1024), (127, 1024), (1024, 127)}
    assert {c.head_dim for c in cases} == {64, 128} and {c.dtype for c in cases} >= {"float32", "float16"}
    assert {c.causal for c in cases} == {False, True} and {c.layout for c in cases} == {"bshd", "bhsd"}


def test_build_cases_takes_unset_axes_from_the_mode():
    cases = C.build_cases(simulator=True, head_dims=[32])
    assert {c.head_dim for c in cases} == {32} and all(c.seqlen_q <= 33 for c in cases)
    cases = C.build_cases(simulator=True, seqlens=["4:8", 3], causal=[True], layouts=["bhsd"], batch=2, heads=3)
    assert [(c.seqlen_q, c.seqlen_k) for c in cases] == [(4, 8), (3, 3)]
    assert all(c.causal and c.layout == "bhsd" and (c.batch, c.heads) == (2, 3) for c in cases)
    with pytest.raises(ValueError):
        C.parse_seqlen("4:x")


def test_tolerance_rules():
    assert C.tolerance("out", "float32") == 1e-5 and C.tolerance("lse", "float32") == 1e-5
    assert all(C.tolerance(g, "float32") == 1e-4 for g in ("dq", "dk", "dv"))
    assert C.lowp_floor("float16") == 2.0**-11 and C.lowp_floor("bfloat16") == 2.0**-8
    assert C.tolerance("out", "float16", 1e-3) == pytest.approx(2e-3 + 2.0**-11)
    assert C.tolerance("dv", "bfloat16", 1e-2) == pytest.approx(3e-2 + 2.0**-8)
    with pytest.raises(ValueError):
        C.tolerance("out", "float16")  # needs the baseline
    with pytest.raises(ValueError):
        C.tolerance("dz", "float32")


def test_judge():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 4, 1, 8))
    assert C.judge("out", "float32", ref.astype(np.float32), ref).passed
    bad = C.judge("out", "float32", ref + 1e-3, ref)
    assert not bad.passed and bad.rel == pytest.approx(1e-3 / np.abs(ref).max())
    nan = ref.copy()
    nan[0, 0, 0, 0] = np.nan
    r = C.judge("out", "float32", nan, ref)
    assert not r.passed and "NaN" in r.note
    # LSE: -inf must match exactly, both ways
    lse = np.array([[[-np.inf, 0.5, 1.5]]])
    assert C.judge("lse", "float32", lse, lse).passed
    r = C.judge("lse", "float32", np.array([[[-1e30, 0.5, 1.5]]]), lse)
    assert not r.passed and "-inf" in r.note
    assert not C.judge("lse", "float32", np.array([[[-np.inf, -np.inf, 1.5]]]), lse).passed
    # fp16: against the same-dtype baseline
    base = ref + 1e-3
    assert C.judge("out", "float16", ref + 1.5e-3, ref, baseline=base).passed
    assert not C.judge("out", "float16", ref + 5e-3, ref, baseline=base).passed
    # a gradient that is zero everywhere is judged against the case's gradient scale
    zero = np.zeros((1, 1, 1, 8))
    assert C.judge("dq", "float32", zero + 1e-9, zero, scale_floor=1e-3).passed
    assert not C.judge("dq", "float32", zero + 1e-6, zero, scale_floor=1e-3).passed


# --------------------------------------------------------------------------------------
# bench (library parts on the CPU; the command needs a GPU)
# --------------------------------------------------------------------------------------


@needs_sim
def test_bench_without_gpu_exits_cleanly():
    result = invoke("bench", "--seqlen", "128")
    assert_clean_exit(result, 1)
    assert "need a CUDA device" in result.output
    result = invoke("bench", "--preset", "fa2", "--json", "out.json", "--plot", "out.png")
    assert_clean_exit(result, 1)
    with pytest.raises(B.NoDeviceError):
        B.run_bench([B.BenchCase(1, 1, 128, 128, 64, False)])


def test_bench_tf32_impl():
    """numba-flash-tf32: listed, accepted by --impl (and then the clean no-GPU exit),
    float32 at head dims 64/128 only; anything else is reported ``unsupported``."""
    assert "numba-flash-tf32" in B.IMPLS
    tf32, plain = B.make_impls(["numba-flash-tf32", "numba-flash"])
    assert (tf32.name, tf32.allow_tf32, plain.name, plain.allow_tf32) == ("numba-flash-tf32", True, "numba-flash", False)
    for pass_ in B.PASSES:
        assert tf32.unsupported(B.BenchCase(1, 2, 256, 256, 64, True, "float32"), pass_) is None
        assert tf32.unsupported(B.BenchCase(1, 2, 256, 256, 128, False, "float32"), pass_) is None
        assert "float32 inputs only" in tf32.unsupported(B.BenchCase(1, 2, 256, 256, 64, False, "float16"), pass_)
        assert "float32 inputs only" in tf32.unsupported(B.BenchCase(1, 2, 256, 256, 64, False, "bfloat16"), pass_)
        assert "head dims" in tf32.unsupported(B.BenchCase(1, 2, 256, 256, 32, False, "float32"), pass_)
        assert plain.unsupported(B.BenchCase(1, 2, 256, 256, 64, False, "float16"), pass_) is None
    r = B.measure(tf32, B.BenchCase(1, 2, 256, 256, 64, False, "float16"), "forward", sets_cache={})
    assert r.status == "unsupported" and r.to_dict()["impl"] == "numba-flash-tf32"
    if SIMULATOR:
        result = invoke("bench", "--seqlen", "128", "--dtype", "float32", "--impl", "numba-flash-tf32")
        assert_clean_exit(result, 1)
        assert "need a CUDA device" in result.output


@needs_sim
def test_memory_without_gpu_exits_cleanly():
    result = invoke("memory", "--json", "mem.json")
    assert_clean_exit(result, 1)
    assert "need a CUDA device" in result.output
    with pytest.raises(B.NoDeviceError):
        M.run_memory(seqlens=[1024])


def test_flop_formula():
    f = B.attention_flops(2, 3, 5, 7, 64, False, "forward")
    assert f == 4 * 2 * 3 * 5 * 7 * 64
    assert B.attention_flops(2, 3, 5, 7, 64, True, "forward") == f / 2
    assert B.attention_flops(2, 3, 5, 7, 64, False, "backward") == 2.5 * f
    assert B.attention_flops(2, 3, 5, 7, 64, True, "forward+backward") == 3.5 * f / 2
    assert B.tflops(1e12, 1000.0) == pytest.approx(1.0)
    assert B.tflops(1e12, None) is None
    with pytest.raises(ValueError):
        B.attention_flops(1, 1, 1, 1, 8, False, "sideways")


def test_ragged_draw_is_the_documented_varlen_row():
    """``bench.cases.ragged_draw``: the draw issue #11's varlen row is timed and modelled on
    (the docs cite its 282–1744 rows), the same every call: 16 lengths summing to 16384."""
    from numba_flash.bench.cases import RAGGED_SEED, ragged_draw, ragged_lengths

    lens = ragged_draw()
    assert len(lens) == 16 and lens.sum() == 16384 and (lens.min(), lens.max()) == (282, 1744)
    assert (ragged_draw() == lens).all()
    assert (ragged_lengths(np.random.default_rng(RAGGED_SEED + 1)) != lens).any()


def test_fa2_preset():
    cases = B.preset_cases("fa2")
    assert len(cases) == 2 * 2 * 6
    for c in cases:
        assert c.batch * c.seqlen_q == 16384 and c.heads * c.head_dim == 2048 and c.seqlen_q == c.seqlen_k
        assert c.dtype == "float16"
    assert {c.seqlen_q for c in cases} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {c.head_dim for c in cases} == {64, 128} and {c.causal for c in cases} == {False, True}
    assert len(B.preset_cases("fa2", ("float16", "bfloat16"))) == 48
    with pytest.raises(ValueError):
        B.preset_cases("fa3")
    one = B.shape_cases(seqlens=[(4096, 4096)], head_dims=[128], causal=[True])
    assert [(c.batch, c.heads, c.causal) for c in one] == [(4, 16, True)]


def test_rotation_count():
    l2 = 60 * 2**20
    assert B.rotation_count(10 * 2**20, l2=l2) == 18
    assert B.rotation_count(1 * 2**30, l2=l2) == 1
    assert B.rotation_count(1024, l2=l2) == B.MAX_SETS
    assert B.rotation_count(10 * 2**20, l2=l2, free=40 * 2**20) == 1


def _synthetic_results():
    case = B.BenchCase(2, 4, 1024, 1024, 64, True, "float16")
    t = lambda ms: B.Timing.from_samples([ms * 0.9, ms, ms * 1.2], rotation=3)  # noqa: E731
    return [
        B.BenchResult("numba-flash", "forward", case, timing=t(2.0)),
        B.BenchResult("numba-flash", "backward", case, timing=t(5.0)),
        B.BenchResult("numba-flash-tf32", "forward", case, "unsupported", "allow_tf32 applies to float32 inputs only"),
        B.BenchResult("cupy-standard", "forward", case, timing=t(4.0)),
        B.BenchResult("cupy-standard", "backward", case, "oom", "out of memory: OutOfMemoryError"),
        B.BenchResult("torch-sdpa-flash", "forward", case, "unavailable", "torch is not importable"),
    ]


def test_bench_results_json_schema(tmp_path):
    results = B.add_derived(_synthetic_results())
    rows = [r.to_dict() for r in results]
    assert all(tuple(r) == B.ROW_KEYS for r in rows)
    by = {(r["impl"], r["pass"]): r for r in rows}
    nf, cp = by[("numba-flash", "forward")], by[("cupy-standard", "forward")]
    flops = 4 * 2 * 4 * 1024 * 1024 * 64 * 0.5
    assert nf["flops"] == flops and nf["ms"] == 2.0 and nf["tflops"] == pytest.approx(flops / 2.0 / 1e9, rel=1e-5)
    assert nf["ratio_vs_numba_flash"] == 1.0 and cp["ratio_vs_numba_flash"] == 2.0
    assert nf["ms_min"] == pytest.approx(1.8) and nf["ms_max"] == pytest.approx(2.4) and nf["reps"] == 3
    assert nf["rotation"] == 3
    both = by[("numba-flash", "forward+backward")]
    assert both["ms"] == 7.0 and both["flops"] == 3.5 * flops and both["status"] == "ok"
    assert by[("cupy-standard", "forward+backward")]["status"] == "oom"
    oom = by[("cupy-standard", "backward")]
    assert oom["ms"] is None and oom["tflops"] is None and oom["ratio_vs_numba_flash"] is None and oom["reps"] == 0
    assert by[("torch-sdpa-flash", "forward")]["status"] == "unavailable"
    assert by[("numba-flash-tf32", "forward")]["status"] == "unsupported"
    assert by[("numba-flash-tf32", "forward")]["ratio_vs_numba_flash"] is None
    assert all(r["status"] in B.STATUSES for r in rows)
    types = {"impl": str, "pass": str, "dtype": str, "batch": int, "heads": int, "seqlen_q": int, "seqlen_k": int,
             "head_dim": int, "causal": bool, "flops": float, "reps": int, "rotation": int, "status": str,
             "detail": str}  # fmt: skip
    for r in rows:
        for key, ty in types.items():
            assert isinstance(r[key], ty), (key, r[key])
        for key in ("ms", "ms_min", "ms_max", "ms_q1", "ms_q3", "tflops", "ratio_vs_numba_flash"):
            assert r[key] is None or isinstance(r[key], float)
    # the document, through a file and back
    path = tmp_path / "out.json"
    B.write_json(results, path, settings={"warmup": 5}, environment={"device": {"name": "x"}})
    doc = json.loads(path.read_text())
    assert doc["schema"] == B.SCHEMA and set(doc) == {"schema", "created", "environment", "settings", "results"}
    assert B.rows_from_json(doc) == json.loads(json.dumps(rows))
    with pytest.raises(ValueError):
        B.rows_from_json({"schema": "other"})
    text = B.csv_text(results)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert list(parsed[0]) == list(B.ROW_KEYS) and len(parsed) == len(rows)


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    results = B.add_derived(_synthetic_results())
    path = tmp_path / "bench.png"
    B.plot(results, path)
    assert path.read_bytes()[:4] == b"\x89PNG"
    # and from JSON rows
    B.plot([r.to_dict() for r in results], tmp_path / "rows.png")
    assert (tmp_path / "rows.png").stat().st_size > 0


def test_memory_library_parts(tmp_path):
    pytest.importorskip("matplotlib")
    assert M.seqlens_up_to(131072) == [1024 * 2**i for i in range(8)]
    assert M.human_bytes(512) == "512 B" and M.human_bytes(3 * 2**30) == "3.0 GiB"
    rows = []
    for n in (1024, 2048, 4096):
        rows.append(M.MemoryResult("numba-flash", "forward", "float16", 1, 1, n, 64, False, 3 * n * 128,
                                   n * 128 + 4 * n, n * 128 + 4 * n + 512))  # fmt: skip
        rows.append(M.MemoryResult("cupy-standard", "forward", "float16", 1, 1, n, 64, False, 3 * n * 128,
                                   n * 128, 4 * n * n))  # fmt: skip
    rows.append(M.MemoryResult("cupy-standard", "forward", "float16", 1, 1, 8192, 64, False, status="oom",
                               detail="out of memory"))  # fmt: skip
    d = rows[0].to_dict()
    assert tuple(d) == M.ROW_KEYS and d["beyond_outputs_bytes"] == 512
    assert rows[-1].to_dict()["peak_bytes"] is None
    doc = M.to_json_dict(rows)
    assert doc["schema"] == M.SCHEMA and len(doc["results"]) == 7
    json.dumps(doc)
    M.plot(rows, tmp_path / "mem.png")
    assert (tmp_path / "mem.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------------------
# info and inspect
# --------------------------------------------------------------------------------------


@needs_sim
def test_info_in_the_simulator():
    result = invoke("info")
    assert_clean_exit(result, 0)
    assert result.output.splitlines()[0].startswith("simulator: on")
    for word in ("compute capability", "SMs", "numba-cuda", "cupy", "numpy", "float32", "float16", "n/a"):
        assert word in result.output
    # --json -: the JSON alone on stdout, the tables on stderr
    result = invoke_split("info", "--json", "-")
    assert_clean_exit(result, 0)
    data = json.loads(result.stdout)
    assert data["simulator"] is True and data["device"]["name"] == "n/a"
    assert {r["dtype"].split(",")[0] for r in data["kernels"]} >= {"float32", "float16"}
    assert data["versions"]["numba-cuda"] != "n/a"
    assert "kernels available" in result.stderr


def test_info_json_file(tmp_path):
    path = tmp_path / "info.json"
    result = invoke_split("info", "--json", str(path))
    assert_clean_exit(result, 0)
    assert "kernels available" in result.stdout and f"wrote {path}" in result.stdout
    data = json.loads(path.read_text())
    assert set(data) >= {"simulator", "device", "versions", "kernels"}


def test_inspect_ptx_alone_on_stdout(tmp_path):
    """#10: ``inspect --ptx > f.ptx`` gave a file that began with the summary table.
    Now stdout carries the PTX alone (the summary goes to stderr), through a real
    redirect to a file; with --json FILE the PTX is in the JSON too."""
    ptx_file, json_file = tmp_path / "fwd.ptx", tmp_path / "fwd.json"
    code = ("import sys\n"
            "try:\n    from numba_flash_cli.main import main\n"
            "except ImportError:\n    from cli.main import main\n"
            "main(prog_name='numba-flash')")  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(ptx_file, "w") as f:
        p = subprocess.run([sys.executable, "-c", code, "inspect", "--pass", "forward", "--dtype", "float32",
                            "--head-dim", "64", "--ptx", "--json", str(json_file)],
                           stdout=f, stderr=subprocess.PIPE, text=True, cwd=root, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr
    ptx = ptx_file.read_text()
    assert ptx.startswith("//") and ".version" in ptx.split(".target")[0]
    for marker in ("numba-flash inspect", "┃", "│", "registers/spills from", "wrote "):
        assert marker not in ptx, marker
    # float32 at d = 64 runs the register-blocked kernel: 16-byte shared loads feed the FMAs
    assert ".entry" in ptx and ".target sm_90" in ptx
    assert "fma.rn.f32" in ptx and "ld.shared.v4.f32" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx  # nothing spilled to local memory
    # the summary went to stderr
    assert "simt_blocked_forward" in p.stderr and "registers / thread" in p.stderr and "fma" in p.stderr
    assert f"wrote {json_file}" in p.stderr
    doc = json.loads(json_file.read_text())
    (k,) = doc["results"]
    assert k["name"] == "simt_blocked_forward" and k["ptx"].strip() in ptx
    # the register-blocked kernels' dynamic shared memory comes from the plan (not n/a)
    assert k["dynamic_shared"] and k["dynamic_shared_bytes"] > 0
    assert "n/a" not in [ln for ln in p.stderr.splitlines() if "dynamic shared (launch)" in ln][0]


def test_inspect_backward_json():
    result = invoke_split("inspect", "--pass", "backward", "--dtype", "float16", "--head-dim", "36", "--causal",
                          "--arch", "sm_75", "--json", "-")  # fmt: skip
    assert_clean_exit(result, 0)
    doc = json.loads(result.stdout)  # the JSON alone on stdout
    assert doc["schema"] == "numba-flash-inspect/1" and doc["family"] == "simt-fp32"
    assert doc["settings"] == {"pass": "backward", "dtype": "float16", "head_dim": 36, "causal": True,
                               "arch": "sm_75", "tf32": False}  # fmt: skip
    assert "sm_75" in doc["note"]  # why not the tensor-core kernels
    kernels = doc["results"]
    assert [k["name"] for k in kernels] == ["simt_bwd_preprocess", "simt_bwd_dkdv", "simt_bwd_dq"]
    for k in kernels:
        assert k["arch"] == "sm_75" and set(k["counts"]) == set(I.COUNT_KEYS) and "ptx" not in k
        assert k["counts"]["ld.local"] == 0 and k["counts"]["atom"] == 0  # dQ without atomics
        assert k["registers"] is None or k["registers"] > 0
    assert kernels[1]["shared_bytes_ptx"] > 0 and kernels[1]["counts"]["bar.sync"] > 0
    assert "simt_bwd_dkdv" in result.stderr  # the summary, on stderr


@pytest.mark.parametrize("arch", ["sm_75", "sm_80"])
def test_inspect_prints_the_plans_note(arch, tmp_path):
    """#10: fp16 at sm_75 printed only n/a.  The plan runs the exact fp32 kernels there
    and says why; the note is printed above the table and is in the JSON."""
    path = tmp_path / "inspect.json"
    result = invoke_split("inspect", "--pass", "forward", "--dtype", "float16", "--head-dim", "64",
                          "--arch", arch, "--json", str(path))  # fmt: skip
    assert_clean_exit(result, 0)
    lines = result.stdout.splitlines()
    doc = json.loads(path.read_text())
    (k,) = doc["results"]
    if arch == "sm_75":
        why = ("the tensor-core kernels do not apply (sm_75 has no mma.sync/cp.async (they need sm_80+)): "
               "exact fp32 kernels run instead")  # fmt: skip
        note = [i for i, ln in enumerate(lines) if ln.startswith("note: ")]
        assert [lines[i] for i in note] == [f"note: {why}"]
        table = next(i for i, ln in enumerate(lines) if ln.startswith("┏"))
        assert note[0] < table
        assert doc["note"] == why and k["note"] == why and doc["family"] == k["family"] == "simt-fp32"
        assert k["name"] == "simt_forward" and k["counts"]["mma"] == 0
    else:
        assert not any(ln.startswith("note:") for ln in lines)
        assert doc["note"] == "" and k["note"] == "" and doc["family"] == k["family"] == "tensor-core"
        assert k["name"] == "tc_forward" and k["counts"]["mma"] > 0
    assert k["registers"] is None or k["registers"] > 0
    assert k["name"] in result.stdout


def test_inspect_tf32_needs_float32(monkeypatch):
    monkeypatch.setattr(I, "inspect_kernels", _must_not_run)
    for dtype in ("float16", "bfloat16"):
        result = invoke("inspect", "--pass", "forward", "--dtype", dtype, "--head-dim", "64", "--tf32")
        assert_clean_exit(result, 2)
        assert "--tf32 applies to --dtype float32" in result.output


# --------------------------------------------------------------------------------------
# output files: checked before any work; --json FILE everywhere, - for stdout
# --------------------------------------------------------------------------------------


def _must_not_run(*args, **kw):
    raise AssertionError("work started before the output paths were checked")


def _no_work(monkeypatch):
    from numba_flash import info as INFO

    monkeypatch.setattr(C, "run_check", _must_not_run)
    monkeypatch.setattr(B, "run_bench", _must_not_run)
    monkeypatch.setattr(B, "require_device", _must_not_run)
    monkeypatch.setattr(M, "run_memory", _must_not_run)
    monkeypatch.setattr(I, "inspect_kernels", _must_not_run)
    monkeypatch.setattr(INFO, "gather_info", _must_not_run)


INSPECT = ["inspect", "--pass", "forward", "--dtype", "float32", "--head-dim", "64"]
OUTPUT_OPTIONS = [
    (["check"], "--json"), (["bench"], "--json"), (["bench"], "--csv"), (["bench"], "--plot"),
    (["memory"], "--json"), (["memory"], "--plot"), (["info"], "--json"), (INSPECT, "--json"),
]  # fmt: skip


@pytest.mark.parametrize("kind", ["missing directory", "a directory", "parent is a file", "not writable"])
@pytest.mark.parametrize("command,option", OUTPUT_OPTIONS, ids=[f"{c[0]} {o}" for c, o in OUTPUT_OPTIONS])
def test_output_paths_are_checked_before_any_work(command, option, kind, tmp_path, monkeypatch):
    """#10: ``check --json /missing/dir/x.json`` ran every case, then a traceback."""
    _no_work(monkeypatch)
    ext = ".png" if option == "--plot" else option.replace("--", ".")
    if kind == "missing directory":
        path = tmp_path / "missing" / "dir" / f"x{ext}"
        expect = "does not exist"
    elif kind == "a directory":
        path = tmp_path
        expect = "is a directory"
    elif kind == "parent is a file":
        (tmp_path / "file").write_text("")
        path = tmp_path / "file" / f"x{ext}"
        expect = "is not a directory"
    else:
        real_access = os.access

        def access(p, mode, **kw):  # tmp_path read-only (the tests may run as root)
            return False if os.path.abspath(p) == str(tmp_path) else real_access(p, mode, **kw)

        monkeypatch.setattr(os, "access", access)
        path = tmp_path / f"x{ext}"
        expect = "is not writable"
    result = invoke(*command, option, str(path))
    assert_clean_exit(result, 2)
    assert f"Invalid value for '{option}'" in result.output and expect in result.output, result.output
    assert not (tmp_path / f"x{ext}").exists()


def test_check_json_to_a_missing_directory_runs_nothing(monkeypatch):
    """The exact command of the issue."""
    _no_work(monkeypatch)
    result = invoke("check", "--json", "/missing/dir/x.json")
    assert_clean_exit(result, 2)
    assert "'/missing/dir' does not exist" in result.output and "PASS" not in result.output


def test_two_outputs_to_one_file_and_unknown_plot_format(tmp_path, monkeypatch):
    _no_work(monkeypatch)
    same = str(tmp_path / "out.json")
    result = invoke("bench", "--json", same, "--csv", same)
    assert_clean_exit(result, 2)
    assert "--json and --csv name the same file" in result.output
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # then --plot fails on the missing matplotlib, also before any work
        return
    result = invoke("memory", "--plot", str(tmp_path / "mem.nosuchformat"))
    assert_clean_exit(result, 2)
    assert "matplotlib cannot write .nosuchformat" in result.output


def test_check_json_to_stdout(monkeypatch):
    """--json -: the JSON document alone on stdout; progress and table on stderr."""
    _fake_api(monkeypatch, error=0.0)
    result = invoke_split("check", "--seqlen", "5", "--head-dim", "8", "--causal", "off", "--seed", "2",
                          "--json", "-")  # fmt: skip
    assert_clean_exit(result, 0)
    doc = json.loads(result.stdout)
    assert doc["schema"] == "numba-flash-check/1" and doc["passed"] is True and doc["seed"] == 2
    assert "PASS" in result.stderr and "all 1 case(s) passed" in result.stderr
    assert not os.path.exists("-")


@needs_sim
@pytest.mark.parametrize("command", [["bench"], ["memory"]])
def test_bench_and_memory_take_json_dash(command):
    result = invoke(*command, "--json", "-")  # accepted; then the clean no-GPU exit
    assert_clean_exit(result, 1)
    assert "need a CUDA device" in result.output


def test_write_json_dash(tmp_path, capsys):
    from numba_flash._report import json_document, write_json

    doc = json_document("x/1", [{"a": 1}], settings={"s": 2})
    write_json(doc, "-")
    assert json.loads(capsys.readouterr().out) == doc
    write_json(doc, tmp_path / "d.json")
    assert json.loads((tmp_path / "d.json").read_text()) == doc


# --------------------------------------------------------------------------------------
# help texts, and a thin command line
# --------------------------------------------------------------------------------------


def test_every_option_has_help():
    """#10: ``memory --help`` listed options without a word on what they do."""
    import click

    missing = []
    for name, cmd in [("(group)", main)] + sorted(main.commands.items()):
        for p in cmd.params:
            if isinstance(p, click.Option) and "--help" not in p.opts and not (p.help or "").strip():
                missing.append(f"{name} {'/'.join(p.opts)}")
    assert not missing, missing


def test_the_command_line_holds_no_kernel_logic():
    """The CLI parses, calls the library and formats: no kernels, numba or CuPy in it."""
    import ast

    source = open(sys.modules[main.callback.__module__].__file__).read()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    bad = {m for m in imported if m.split(".")[0] in ("numba", "cupy", "torch")
           or m.startswith(("numba_flash.kernels", "numba_flash.plan", "numba_flash.api", "numba_flash.config"))}
    assert not bad, bad
    assert "cuda.jit" not in source and "compile_ptx(" not in source


def test_ptx_counting():
    ptx = """
.version 8.0
.target sm_90
.visible .shared .align 4 .b8 _smem_a[4096];
.shared .align 16 .f32 _smem_b[100];
.extern .shared .align 16 .b8 dyn[];
.local .align 8 .b8 __local_depot0[24];
.visible .entry k(
{
$L__BB0_1:
	ld.param.u64 	%rd1, [k_param_0];
	ld.global.nc.f32 	%f1, [%rd1];
	ld.f32 	%f2, [%rd2];
	st.f32 	[%rd2], %f2;
	ld.shared.f32 	%f3, [%rd3];
	@%p1 st.shared.v2.f32 	[%rd3], {%f1, %f2};
	ld.local.u32 	%r1, [%rd4];
	st.local.u32 	[%rd4], %r1;
	fma.rn.f32 	%f4, %f1, %f2, %f3;
	ex2.approx.ftz.f32 	%f5, %f4;
	shfl.sync.bfly.b32 	%r2, %r1, 1, 31, -1;
	bar.sync 	0;
	bar.warp.sync 	-1;
	mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2,%r3,%r4}, [%r5];
	cp.async.cg.shared.global [%r1], [%rd1], 16;
	atom.global.add.f32 	%f6, [%rd1], %f1;
	ret;
}
"""
    c = I.count_instructions(ptx)
    expect = {"ld.param": 1, "ld.global": 1, "ld.generic": 1, "st.generic": 1, "ld.shared": 1, "st.shared": 1,
              "ld.local": 1, "st.local": 1, "fma": 1, "ex2": 1, "shfl": 1, "bar.sync": 1, "mma": 1,
              "ldmatrix": 1, "cp.async": 1, "atom": 1, "total": 18}  # fmt: skip
    for k, v in expect.items():
        assert c[k] == v, (k, c[k], v)
    assert I.declared_memory(ptx) == (4096 + 400, 24, True)
    assert I.parse_arch("sm_90") == (9, 0) and I.parse_arch("sm_120") == (12, 0) and I.parse_arch("8.6") == (8, 6)
    assert I.parse_arch("sm_90a") == (9, 0)  # the arch-specific target keeps its "a" in --arch:
    from numba_flash_cli.main import _parse_arch_opt

    assert _parse_arch_opt(None, None, "sm_90a") == "sm_90a" and _parse_arch_opt(None, None, "90") == "sm_90"
    log_ptxas = ("ptxas info    : Function properties for k\n"
                 "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
                 "ptxas info    : Used 168 registers, used 1 barriers, 42112 bytes smem, 400 bytes cmem[0]")  # fmt: skip
    r = I.parse_resource_log(log_ptxas)
    assert r == {"registers": 168, "stack_bytes": 16, "spill_stores": 8, "spill_loads": 4, "shared_bytes": 42112,
                 "local_bytes": None}  # fmt: skip
    log_nvjitlink = "info    : used 124 registers, used 1 barriers, 0 stack, 42112 bytes smem, 1040 bytes cmem[0], 0 bytes lmem"
    r = I.parse_resource_log(log_nvjitlink)
    assert r["registers"] == 124 and r["stack_bytes"] == 0 and r["local_bytes"] == 0


# --------------------------------------------------------------------------------------
# on a GPU: the peers for real (pytest -m gpu)
# --------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_bench_on_gpu_small(tmp_path):
    cases = [B.BenchCase(2, 4, 512, 512, 64, True, "float16"), B.BenchCase(1, 2, 256, 384, 64, False, "float32")]
    results = B.run_bench(cases, warmup=2, rep=5, min_rep=3, budget_ms=200)
    rows = [r.to_dict() for r in results]
    nf = [r for r in rows if r["impl"] == "numba-flash"]
    assert nf and all(r["status"] == "ok" and r["ms"] > 0 and r["ratio_vs_numba_flash"] == 1.0 for r in nf)
    assert all(r["status"] in B.STATUSES for r in rows)
    assert any(r["impl"] == "cupy-standard" and r["status"] == "ok" for r in rows)
    tf32 = {r["dtype"]: r["status"] for r in rows if r["impl"] == "numba-flash-tf32" and r["pass"] != "forward+backward"}
    assert tf32 == {"float16": "unsupported", "float32": "ok"}
    fa_fp32 = [r for r in rows if r["impl"] == "torch-sdpa-flash" and r["dtype"] == "float32"]
    assert all(r["status"] in ("unsupported", "unavailable") for r in fa_fp32)
    json.dumps(B.to_json_dict(results))


@pytest.mark.gpu
def test_memory_on_gpu_small():
    results = M.run_memory(seqlens=[1024, 2048], dtype="float32")
    nf = [r for r in results if r.impl == "numba-flash" and r.pass_ == "forward"]
    assert all(r.status == "ok" and r.beyond_outputs_bytes <= 4096 for r in nf)
    std = [r for r in results if r.impl == "cupy-standard" and r.pass_ == "forward"]
    assert all(r.status == "ok" and r.peak_bytes >= 4 * r.seqlen**2 for r in std)


@pytest.mark.gpu
def test_time_fn_on_gpu():
    import cupy

    x = cupy.ones((1 << 20,), cupy.float32)
    t = B.time_fn([lambda: x * 2, lambda: x + 1], warmup=2, rep=10, min_rep=3, budget_ms=None)
    assert t.reps == 10 and t.rotation == 2 and 0 < t.ms_min <= t.ms <= t.ms_max
    assert not math.isnan(t.ms_q1)


def test_check_tf32_cases_tolerance_and_usage_errors():
    cases = C.build_cases(simulator=True, tf32=True)
    assert cases and all(c.tf32 and c.dtype == "float32" and c.head_dim in (64, 128) for c in cases)
    assert all(c.label.startswith("float32+tf32 ") for c in cases)
    assert {c.head_dim for c in C.build_cases(simulator=False, tf32=True)} == {64, 128}
    # the bound: factor x the TF32 baseline's error + the float32 bound
    assert C.tolerance("out", "tf32", 4e-4) == pytest.approx(2 * 4e-4 + 1e-5)
    assert C.tolerance("dq", "tf32", 5e-4) == pytest.approx(3 * 5e-4 + 1e-4)
    with pytest.raises(ValueError, match="tf32"):
        C.tolerance("out", "tf32")
    with pytest.raises(ValueError, match="head dims"):
        C.CaseSpec(1, 1, 5, 5, 32, False, tf32=True)
    for args in (("--dtype", "float16"), ("--head-dim", "32")):
        result = invoke("check", "--tf32", *args)
        assert_clean_exit(result, 2)
        assert "tf32" in result.output


def test_check_tf32_case_runs_the_tf32_kernel():
    """One real forward case in the simulator: the API gets allow_tf32=True, and the
    result is judged against the TF32-rounded baseline (so it passes), while an exact
    float32 judgement of the same output fails (TF32 error is ~1e-3)."""
    case = C.CaseSpec(1, 1, 5, 9, 64, False, "bshd", "float32", tf32=True)
    r = C.check_case(case, seed=11, passes=("forward",))
    assert r.error is None and r.passed, r.error
    out = {o.output: o for o in r.outputs}["out"]
    assert out.baseline_rel is not None and out.rel > 1e-5  # TF32-sized error, within its bound


def test_check_takes_the_variants(tmp_path):
    """``check --kv-heads --window --softcap --alibi --dropout``: the variants reach the
    kernels and the reference alike (JSON records them) and the case passes."""
    path = tmp_path / "v.json"
    result = invoke("check", "--seqlen", "5:9", "--head-dim", "64", "--heads", "2", "--kv-heads", "1", "--window",
                    "3,1", "--softcap", "2", "--alibi", "--dropout", "0.2", "--causal", "off", "--seed", "4",
                    "--json", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "kv_heads=1 window=3,1 softcap=2 alibi dropout=0.2" in result.output
    doc = json.loads(path.read_text())
    case = doc["results"][0]["case"]
    assert (case["kv_heads"], tuple(case["window"]), case["softcap"], case["alibi"], case["dropout"]) == (
        1, (3, 1), 2.0, True, 0.2)  # fmt: skip
    assert doc["passed"] and len(doc["results"][0]["outputs"]) == 5


@pytest.mark.parametrize(
    "args,match",
    [
        (("--heads", "2", "--kv-heads", "3"), "kv_heads: expected a divisor of heads=2, got 3"),
        (("--window", "3"), "expected L,R"),
        (("--window", "-2,0"), "expected each side -1"),
        (("--dropout", "1.0"), "dropout"),
        (("--softcap", "-1"), "softcap"),
    ],
)
def test_check_variant_usage_errors(args, match):
    result = invoke("check", *args)
    assert result.exit_code == 2 and match in result.output, result.output


def test_bench_variant_cases_and_flops():
    """``bench``'s variant cases: FLOPs count only the visible pairs of a window (against
    a brute-force count), peers without a variant say so, and a bad --kv-heads is a
    usage error before any device is asked for."""
    from numba_flash import bench as B
    from numba_flash.bench.peers import CupyStandard, TorchSDPA

    for nq, nk, causal, window in ((7, 7, True, (-1, -1)), (5, 9, False, (2, 1)), (9, 5, True, (3, -1)),
                                   (6, 6, False, (-1, 0)), (1, 4, False, (0, 0))):  # fmt: skip
        i, j = np.arange(nq)[:, None] + nk - nq, np.arange(nk)[None, :]
        left, right = window[0], 0 if causal else window[1]
        vis = np.ones((nq, nk), bool)
        vis &= (j >= i - left) if left >= 0 else vis
        vis &= (j <= i + right) if right >= 0 else vis
        assert B.visible_pairs(nq, nk, causal, window) == vis.sum(), (nq, nk, causal, window)
    case = B.BenchCase(1, 4, 64, 64, 32, True, "float16", kv_heads=2, window=(8, 0), softcap=30.0, alibi=True)
    assert case.label.endswith("causal kv_heads=2 window=8,0 softcap=30 alibi")
    assert case.kv_heads == 2 and B.BenchCase(1, 4, 64, 64, 32, True).kv_heads == 4
    assert B.attention_flops(1, 4, 64, 64, 32, True, "forward", (8, 0)) == 4 * 4 * 32 * B.visible_pairs(64, 64, True, (8, 0))
    assert "sliding window / softcap / ALiBi" in TorchSDPA("torch-sdpa-flash").unsupported(case, "forward")
    assert "plain or causal" in CupyStandard().unsupported(case, "forward")
    gqa = B.with_variants([B.BenchCase(2, 8, 128, 128, 64, False)], dict(kv_heads=2))[0]
    assert TorchSDPA("torch-sdpa-flash").unsupported(gqa, "forward") is None  # enable_gqa=True
    with pytest.raises(ValueError, match="kv_heads: expected a divisor of heads=8, got 3"):
        B.with_variants([B.BenchCase(2, 8, 128, 128, 64, False)], dict(kv_heads=3))
    result = invoke("bench", "--heads", "8", "--kv-heads", "3", "--seqlen", "128")
    assert result.exit_code == 2 and "kv_heads: expected a divisor of heads=8, got 3" in result.output, result.output


def test_check_varlen():
    """``check --varlen``: packed sequences (some empty) through flash_attention_varlen,
    forward and backward, judged against the reference with the per-sequence baseline."""
    result = invoke("check", "--varlen", "--batch", "3", "--seqlen", "5:7", "--head-dim", "64", "--heads", "2",
                    "--kv-heads", "1", "--causal", "on", "--seed", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mean Nq=5 Nk=7" in result.output and "varlen" in result.output and "all 1 case(s) passed" in result.output


# --------------------------------------------------------------------------------------
# bench --varlen (the library on the CPU; the kernels of one tiny case in the simulator)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch,mean,seed", [(16, 1024, 0), (32, 512, 7), (7, 1, 0), (3, 2, 1), (100, 3, 2), (1, 9, 0)])
def test_varlen_seqlens(batch, mean, seed):
    """A varlen case's lengths: ``batch`` of them, total exactly batch·mean, each >= 1,
    spread around the mean, the same for the same seed."""
    lens = B.varlen_seqlens(batch, mean, seed)
    assert len(lens) == batch and sum(lens) == batch * mean and min(lens) >= 1
    assert all(type(n) is int for n in lens)
    assert lens == B.varlen_seqlens(batch, mean, seed)
    if batch >= 16:  # uniform in [mean/4, 7·mean/4], then rescaled to the total
        assert mean // 8 <= min(lens) < mean < max(lens) <= 2 * mean
        assert lens != B.varlen_seqlens(batch, mean, seed + 1)
    for bad in ((0, 4), (4, 0), (True, 4)):
        with pytest.raises(ValueError, match="expected a positive int"):
            B.varlen_seqlens(*bad)


def test_bench_varlen_case_and_flops():
    """A varlen case: label, offsets, its padded batch, and FLOPs that count each
    sequence's visible pairs (against a hand count), the same for every implementation."""
    from dataclasses import replace

    case = B.BenchCase(3, 2, 3, 3, 8, True, "float16", seqlens=(3, 5, 1))
    assert case.varlen and case.max_seqlen == 5 and case.label == "float16 varlen B=3 mean=3 max=5 H=2 d=8 causal"
    assert case.cu_seqlens.tolist() == [0, 3, 8, 9] and case.cu_seqlens.dtype == np.int32
    pad = case.padded
    assert (pad.batch, pad.heads, pad.seqlen_q, pad.seqlen_k, pad.causal, pad.varlen) == (3, 2, 5, 5, True, False)
    assert pad.padded is pad and not B.BenchCase(3, 2, 3, 3, 8, True).varlen
    # by hand: causal L(L+1)/2 = 6 + 15 + 1; full L² = 9 + 25 + 1; window (1, 0): (1+2+2) + (1+2+2+2+2) + 1
    for causal, window, pairs in ((True, (-1, -1), 22), (False, (-1, -1), 35), (True, (1, 0), 15), (False, (1, 0), 15)):
        c = replace(case, causal=causal, window=window)
        for pass_, mult in (("forward", 1.0), ("backward", 2.5), ("forward+backward", 3.5)):
            want = 4 * 2 * 8 * pairs * mult
            assert B.attention_flops(3, 2, 3, 3, 8, causal, pass_, window, (3, 5, 1)) == want
            for impl in ("numba-flash", "numba-flash-padded", "cupy-standard", "torch-sdpa-flash"):
                assert B.BenchResult(impl, pass_, c).flops == want, (impl, pass_, causal, window)
    for kw, match in (
        (dict(seqlen_k=4, seqlens=(3, 3)), "seqlen_q must equal seqlen_k, got 3:4"),
        (dict(seqlens=(3, 4)), "expected batch=2 lengths summing to batch·seqlen_q=6, got 2 summing to 7"),
        (dict(seqlens=(6,)), "expected batch=2 lengths"),
        (dict(seqlens=(0, 6)), "seqlens: expected positive ints"),
    ):
        args = dict(batch=2, heads=1, seqlen_q=3, seqlen_k=3, head_dim=8, causal=False) | kw
        with pytest.raises(ValueError, match=match):
            B.BenchCase(**args)
    cases = B.varlen_cases(B.shape_cases(seqlens=[(1024, 1024)], head_dims=[128], causal=[False, True]), seed=3)
    assert [c.batch for c in cases] == [16, 16]
    assert cases[0].seqlens == cases[1].seqlens == B.varlen_seqlens(16, 1024, 3)
    assert cases[0].label.startswith("float16 varlen B=16 mean=1024 max=")
    with pytest.raises(ValueError, match="seqlen_q must equal seqlen_k"):
        B.varlen_cases([B.BenchCase(2, 1, 3, 4, 8, False)])


def test_bench_varlen_impls_run_packed_or_padded():
    """numba-flash (and -tf32) run the packed varlen case; every other implementation,
    numba-flash-padded included, gets the padded batch, and reports what it cannot run
    as unsupported, its row still marked padded."""
    names = ["numba-flash", "numba-flash-tf32", "numba-flash-padded", "cupy-standard", "torch-sdpa-flash"]
    nf, tf32, pad, cp, sdpa = B.make_impls(names)
    case = B.varlen_cases([B.BenchCase(4, 2, 64, 64, 32, True, "bfloat16")])[0]
    assert nf.run_case(case) is case and tf32.run_case(case) is case
    assert pad.run_case(case) == cp.run_case(case) == sdpa.run_case(case) == case.padded
    assert pad.name == "numba-flash-padded" and pad.varlen_only and not nf.varlen_only and not cp.varlen_only
    dense = B.BenchCase(2, 4, 64, 64, 32, True)
    assert all(i.run_case(dense) is dense for i in (nf, pad, cp, sdpa))
    r = B.measure(cp, case, "forward", sets_cache={})
    assert r.status in ("unsupported", "unavailable") and r.padded and r.to_dict()["padded"]
    assert "bfloat16" in r.detail or r.status == "unavailable"
    assert r.flops == B.BenchResult("numba-flash", "forward", case).flops
    with pytest.raises(ValueError, match="separate rows"):
        B.NumbaFlash(allow_tf32=True, padded=True)


def _fake_bench_run(monkeypatch, ms):
    """run_bench without a device: ``measure`` replaced by fixed timings ``ms[impl]``;
    returns the (impl, varlen, pass) measured."""
    from numba_flash.bench import run as R

    seen = []

    def measure(impl, case, pass_, **kw):
        seen.append((impl.name, case.varlen, pass_))
        return B.BenchResult(impl.name, pass_, case, timing=B.Timing.from_samples([ms[impl.name]]))

    monkeypatch.setattr(R, "require_device", lambda: None)
    monkeypatch.setattr(R, "l2_bytes", lambda: None)
    monkeypatch.setattr(R, "measure", measure)
    return seen


def test_run_bench_varlen_rows(monkeypatch, tmp_path):
    """run_bench: numba-flash-padded only on varlen cases; the rows carry the lengths and
    the padded flag (JSON, CSV, plot), and the ratio to numba-flash is the time ratio."""
    seen = _fake_bench_run(monkeypatch, {"numba-flash": 2.0, "numba-flash-padded": 3.0, "cupy-standard": 5.0})
    dense = B.BenchCase(2, 4, 64, 64, 32, True)
    varlen = B.varlen_cases([dense], seed=1)[0]
    progress = []
    results = B.run_bench([dense, varlen], impls=["numba-flash", "numba-flash-padded", "cupy-standard"],
                          progress=lambda done, total, desc: progress.append((done, total)))  # fmt: skip
    assert ("numba-flash-padded", False, "forward") not in seen and ("numba-flash-padded", True, "forward") in seen
    assert progress[-1] == (10, 10) and len(seen) == 10  # dense: 2 impls × 2 passes; varlen: 3 × 2
    rows = [r.to_dict() for r in results]
    assert all(tuple(r) == B.ROW_KEYS for r in rows)
    vr = [r for r in rows if r["varlen"]]
    assert {(r["impl"], r["padded"]) for r in vr} == {("numba-flash", False), ("numba-flash-padded", True),
                                                       ("cupy-standard", True)}  # fmt: skip
    flops = B.attention_flops(2, 4, 64, 64, 32, True, "forward", seqlens=varlen.seqlens)
    for r in vr:
        assert (r["total_seqlen"], r["max_seqlen"], r["seqlens"]) == (128, max(varlen.seqlens), list(varlen.seqlens))
        assert r["flops"] == flops * {"forward": 1, "backward": 2.5, "forward+backward": 3.5}[r["pass"]]
        want = {"numba-flash": 1.0, "numba-flash-padded": 1.5, "cupy-standard": 2.5}[r["impl"]]
        assert r["ratio_vs_numba_flash"] == want and r["tflops"] == pytest.approx(r["flops"] / r["ms"] / 1e9, rel=1e-5)
    dr = [r for r in rows if not r["varlen"]]
    assert dr and all(not r["padded"] and r["seqlens"] is None and r["max_seqlen"] is None for r in dr)
    json.dumps(B.to_json_dict(results))
    parsed = list(csv.DictReader(io.StringIO(B.csv_text(results))))
    one = next(p for p in parsed if p["varlen"] == "True" and p["impl"] == "cupy-standard")
    assert one["padded"] == "True" and one["seqlens"] == " ".join(map(str, varlen.seqlens))
    if importlib.util.find_spec("matplotlib"):
        B.plot(results, tmp_path / "varlen.png")
        assert (tmp_path / "varlen.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args,match",
    [
        (("--varlen", "--seqlen", "64:128"), "give --seqlen N, not NQ:NK (got 64:128)"),
        (("--seed", "3"), "--seed draws the --varlen lengths"),
        (("--impl", "numba-flash-padded"), "numba-flash-padded times a --varlen case's padded batch: add --varlen"),
        (("--varlen", "--heads", "8", "--kv-heads", "3"), "kv_heads: expected a divisor of heads=8, got 3"),
        (("--varlen", "--seed", "-1"), "--seed"),
    ],
)
def test_bench_varlen_usage_errors(args, match, monkeypatch):
    _no_work(monkeypatch)
    result = invoke("bench", *args)
    assert_clean_exit(result, 2)
    assert match in result.output, result.output


def test_bench_varlen_command(monkeypatch, tmp_path):
    """``bench --varlen``: the cases reach run_bench packed (batch 16384 // seqlen,
    lengths of the seed), numba-flash-padded among the default implementations, the
    table labels them "varlen B= mean= max=" and marks the padded rows, the JSON keeps
    the seed."""
    from numba_flash import info as INFO

    got = {}

    def run_bench(cases, *, impls, passes, **kw):
        got.update(cases=cases, impls=impls)
        t = B.Timing.from_samples([1.0])
        return B.add_derived([B.BenchResult(i, p, c, timing=t) for c in cases for p in passes for i in impls])

    monkeypatch.setattr(B, "require_device", lambda: None)
    monkeypatch.setattr(B, "l2_bytes", lambda: None)
    monkeypatch.setattr(B, "run_bench", run_bench)
    monkeypatch.setattr(INFO, "gather_info", lambda: {"device": {"name": "fake", "compute_capability": "9.0",
                                                                 "sms": 132}, "versions": {}})  # fmt: skip
    path = tmp_path / "v.json"
    result = invoke("bench", "--varlen", "--seqlen", "1024", "--head-dim", "128", "--causal", "on", "--seed", "7",
                    "--impl", "numba-flash", "--impl", "numba-flash-padded", "--impl", "torch-sdpa-flash",
                    "--pass", "forward", "--no-progress", "--json", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    (case,) = got["cases"]
    assert case.seqlens == B.varlen_seqlens(16, 1024, 7) and (case.batch, case.heads, case.causal) == (16, 16, True)
    assert f"float16 varlen B=16 mean=1024 max={case.max_seqlen} H=16 d=128 causal" in result.output
    assert "varlen lengths of seed 7" in result.output and "p: ran the padded batch (B, max, H, d)" in result.output
    assert "(1.00×) p" in result.output  # torch-sdpa-flash's cell
    doc = json.loads(path.read_text())
    assert doc["settings"]["varlen_seed"] == 7
    assert {(r["impl"], r["padded"]) for r in doc["results"]} == {
        ("numba-flash", False), ("numba-flash-padded", True), ("torch-sdpa-flash", True)}  # fmt: skip
    result = invoke("bench", "--varlen", "--seqlen", "4096", "--pass", "forward", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "numba-flash-padded" in got["impls"] and got["cases"][0].seqlens == B.varlen_seqlens(4, 4096, B.VARLEN_SEED)
    result = invoke("bench", "--seqlen", "4096", "--pass", "forward", "--no-progress")
    assert result.exit_code == 0 and "numba-flash-padded" not in got["impls"] and not got["cases"][0].varlen


@needs_sim
def test_bench_varlen_calls_in_the_simulator():
    """One tiny varlen case through the calls bench times (NumPy input sets, the kernels
    in the simulator): numba-flash's packed call and numba-flash-padded's dense call on
    the padded batch agree on the real rows (causal: a real query sees real keys only)."""
    from numba_flash.bench.timing import InputSet

    case = B.BenchCase(3, 2, 4, 4, 64, True, "float32", kv_heads=1, seqlens=(4, 6, 2))
    s = InputSet(case, seed=1, xp=np)
    assert s.q.shape == (3, 6, 2, 64) and s.k.shape == (3, 6, 1, 64)
    assert s.packed("q").shape == (12, 2, 64) and s.packed("v").shape == (12, 1, 64)
    assert np.array_equal(s.packed("k")[4:10], s.k[1]) and s.cu_seqlens().tolist() == [0, 4, 10, 12]
    nf, pad = B.make_impls(["numba-flash", "numba-flash-padded"])
    outs = {}
    for pass_ in ("forward", "backward"):
        for impl in (nf, pad):
            (fn,), setup = impl.prepare(impl.run_case(case), pass_, [s])
            assert setup is None
            outs[impl.name, pass_] = fn()
    (o, lse), (po, plse) = outs["numba-flash", "forward"], outs["numba-flash-padded", "forward"]
    dq, pdq = outs["numba-flash", "backward"][0], outs["numba-flash-padded", "backward"][0]
    assert o.shape == (12, 2, 64) and lse.shape == (2, 12) and po.shape == (3, 6, 2, 64)
    cu = case.cu_seqlens
    for b, n in enumerate(case.seqlens):
        rows = slice(cu[b], cu[b + 1])
        np.testing.assert_allclose(o[rows], po[b, :n], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse[:, rows], plse[b, :, :n], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dq[rows], pdq[b, :n], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_bench_varlen_on_gpu_small():
    """A varlen case for real: numba-flash runs it packed, numba-flash-padded and the
    peers the padded batch, every row crediting the same real pairs."""
    case = B.varlen_cases([B.BenchCase(4, 4, 256, 256, 64, True, "float16")], seed=3)[0]
    impls = ["numba-flash", "numba-flash-padded", "cupy-standard", "torch-sdpa-flash"]
    results = B.run_bench([case], impls=impls, warmup=2, rep=5, min_rep=3, budget_ms=200)
    rows = [r.to_dict() for r in results]
    assert {r["impl"] for r in rows} == set(impls) and all(r["status"] in B.STATUSES for r in rows)
    for r in rows:
        assert r["varlen"] and r["padded"] == (r["impl"] != "numba-flash") and r["total_seqlen"] == 1024
        assert r["flops"] == B.attention_flops(4, 4, 256, 256, 64, True, r["pass"], seqlens=case.seqlens)
    assert all(r["status"] == "ok" and r["ms"] > 0 for r in rows if r["impl"] != "torch-sdpa-flash")


@pytest.mark.parametrize("args,match", [
    (("bench", "--decode", "--seqlen", "100:200"), "the cache length"),
    (("bench", "--decode", "--preset", "smoke"), "plain decode steps"),
    (("bench", "--decode", "--heads", "6", "--kv-heads", "4"), "heads=6"),
    (("bench", "--decode", "--page-size", "300", "--seqlen", "4096"), "page_size=300"),
    (("bench", "--page-size", "16"), "--decode option"),
    (("memory", "--kv-heads", "2"), "--decode options"),
    (("memory", "--decode", "--causal"), "do not apply"),
])  # fmt: skip
def test_decode_options_are_checked(args, match):
    """``bench --decode`` / ``memory --decode``: options that do not fit are usage
    errors naming them, before any device is asked for."""
    result = invoke(*args)
    assert_clean_exit(result, 2)
    assert match in result.output, result.output


@pytest.mark.parametrize("cmd", ["bench", "memory"])
def test_decode_needs_a_device(cmd):
    if not SIMULATOR:
        pytest.skip("checks the simulator's refusal (a GPU runs the decode)")
    result = invoke(cmd, "--decode", "--seqlen" if cmd == "bench" else "--min-seqlen", "4096")
    assert_clean_exit(result, 1)
    assert "need a CUDA device" in result.output, result.output
