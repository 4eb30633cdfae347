"""``numba-flash launch`` (``numba_flash.launch``) and ``distributed.init_ring``'s
inputs: processes get their rank, the world size and one NCCL id; a failing rank stops
the others and its exit code comes back; communicators are wrapped as rings.  No GPU:
the launched scripts are plain Python, and the NCCL id is given."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

from numba_flash import distributed as dist
from numba_flash import launch as L


def _script(tmp_path, body):
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_every_rank_gets_its_place_and_the_same_id(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    script = _script(tmp_path, f"""
        import json, os, sys
        keys = ("{L.RANK}", "{L.WORLD}", "{L.NCCL_ID}", "NCCL_NVLS_ENABLE")
        out = {{k: os.environ.get(k) for k in keys}}
        out["argv"] = sys.argv[1:]
        with open(os.path.join({str(tmp_path)!r}, "rank" + os.environ["{L.RANK}"] + ".json"), "w") as f:
            json.dump(out, f)
    """)
    assert L.launch(script, ["--seqlen", "8"], nproc=3, nccl_id="ab01", poll_s=0.05) == 0
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    for r, env in enumerate(seen):
        assert env == {L.RANK: str(r), L.WORLD: "3", L.NCCL_ID: "ab01", "NCCL_NVLS_ENABLE": "0",
                       "argv": ["--seqlen", "8"]}  # fmt: skip
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # a value the caller set is kept
    assert L.rank_env(0, 1, "ab")["NCCL_NVLS_ENABLE"] == "1"


def test_a_failing_rank_stops_the_others(tmp_path):
    script = _script(tmp_path, f"""
        import os, sys, time
        if os.environ["{L.RANK}"] == "1":
            sys.exit(3)
        time.sleep(60)
    """)
    t = time.perf_counter()
    assert L.launch(script, nproc=2, nccl_id="00", poll_s=0.05) == 3
    assert time.perf_counter() - t < 30, "the sleeping rank was not stopped"


def test_bad_launches_raise():
    with pytest.raises(ValueError, match="nproc=0"):
        L.launch(sys.argv[0], nproc=0, nccl_id="00")
    with pytest.raises(ValueError, match="no such file"):
        L.launch("/no/such/script.py", nproc=1, nccl_id="00")


def test_unique_id_round_trip():
    """CuPy's ids are signed chars; the hex form is their bytes."""
    uid = tuple(range(-128, 0)) + tuple(range(0, 128))
    assert L.unique_id_tuple(bytes(b & 0xFF for b in uid).hex()) == uid


def test_rank_and_world_from_the_launcher_or_mpirun(monkeypatch):
    for k in (L.RANK, L.WORLD) + L.MPI_RANK_VARS + L.MPI_SIZE_VARS:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(RuntimeError, match="numba-flash launch"):
        L.rank_and_world()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert L.rank_and_world() == (1, 2)
    monkeypatch.setenv(L.RANK, "0")
    monkeypatch.setenv(L.WORLD, "4")
    assert L.rank_and_world() == (0, 4)


def test_communicators_become_rings(monkeypatch):
    class Ring:
        rank, world = 0, 2

        def exchange(self, arrays):
            return arrays

    ring = Ring()
    assert dist._as_ring(ring) is ring
    made = []
    monkeypatch.setattr(dist, "NcclRing", lambda comm, rank, world: made.append((comm, rank, world)) or "ring")

    class Comm:  # cupy.cuda.nccl.NcclCommunicator's interface
        def rank_id(self):
            return 1

        def size(self):
            return 2

    comm = Comm()
    assert dist._as_ring(comm) == "ring" and made[-1] == (comm, 1, 2)

    class Backend:  # cupyx.distributed.NCCLBackend keeps its communicator in _comm
        _comm = comm

    assert dist._as_ring(Backend()) == "ring" and made[-1] == (comm, 1, 2)
    with pytest.raises(TypeError, match="comm: expected a NcclRing"):
        dist._as_ring(object())


def test_cli_launch_checks_its_arguments():
    from test_cli import assert_clean_exit, invoke

    result = invoke("launch")
    assert_clean_exit(result, 2)
    assert "SCRIPT" in result.output


def test_cli_print_id_gives_an_id_or_says_why_not():
    """``launch --print-id``: a 128-byte id in hex where CuPy loads NCCL, else a clean
    error naming the missing library (no traceback)."""
    from test_cli import assert_clean_exit, invoke

    result = invoke("launch", "--print-id")
    if result.exit_code == 0:
        assert len(bytes.fromhex(result.output.strip())) == 128
    else:
        assert_clean_exit(result, 1)
        assert "NCCL" in result.output
