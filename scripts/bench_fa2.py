"""Issue #11's variant rows against FlashAttention-2 itself, fp16, on one GPU, in one process:
the same inputs through our API and through torch's FlashAttention-2 op
(``torch.ops.aten._flash_attention_forward`` / ``_backward``, what SDPA's flash backend calls),
which also takes the variants SDPA does not pass on: sliding windows, packed variable-length
batches (``cum_seq_q``/``cum_seq_k``) and ALiBi slopes (forward only; torch's backward op has
no slopes argument). softcap is not in torch's op: its row is ours alone.

    python3 scripts/bench_fa2.py out.jsonl [--queued]

GQA (32 query heads over 8 KV heads) against MHA at the same q shape comes first.

Two questions a row answers: how fast we are against FlashAttention-2 on the variant (``ours /
FA2`` time), and what the variant costs FlashAttention-2 itself, measured the way the issue's
bar measures ours (the window's visible TFLOP/s against causal's, varlen's against the padded
batch's, the time against plain). Timings as ``bench_variants.py`` takes them (its
``interleaved``: cases timed in turn over rounds, medians; ``--queued``: 10 back-to-back calls
between two events). Printed last: a table of both.
"""

import json
import sys

import cupy as cp
import numpy as np

import bench_variants as bv  # calls, interleaved, randn (scripts/ is on sys.path)
from numba_flash.bench.cases import ragged_draw, visible_pairs


def fa2_calls(q, k, v, dout, causal, window=(-1, -1), slopes=None, dropout_p=0.0, cu=None, max_len=None):
    """(forward, backward) of torch's FlashAttention-2 op on the inputs, in the shape
    :func:`bench_variants.calls` gives ours. ``cu``: cumulative lengths (varlen; q, k, v
    packed as (total, H, d)); otherwise (B, N, H, d)."""
    import torch

    tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda") for x in (q, k, v, dout))
    tcu = None if cu is None else torch.as_tensor(cu, device="cuda", dtype=torch.int32)
    nq = max_len if cu is not None else tq.shape[1]
    nk = max_len if cu is not None else tk.shape[1]
    ts = None if slopes is None else torch.as_tensor(slopes, device="cuda")
    left, right = window
    wl = None if left < 0 and right < 0 else left
    wr = None if left < 0 and right < 0 else right
    fwd_op = torch.ops.aten._flash_attention_forward
    bwd_op = torch.ops.aten._flash_attention_backward

    def fwd():
        return fwd_op(tq, tk, tv, tcu, tcu, nq, nk, dropout_p, causal, False, scale=None,
                      window_size_left=wl, window_size_right=wr, alibi_slopes=ts), None  # fmt: skip

    def bwd(res, _):
        out, lse, rng_state, unused, _ = res
        # dense: None for the offsets (an undefined tensor to the op)
        return bwd_op(tdo, tq, tk, tv, out, lse, tcu, tcu, nq, nk, dropout_p, causal, rng_state, unused,
                      scale=None, window_size_left=wl, window_size_right=wr)  # fmt: skip

    return fwd, bwd


def checked(fwd, bwd):
    """``(fwd, bwd)`` if torch's op runs the case (forward, and backward where it can), else
    the first line of its error; a backward it refuses is replaced by ``None``."""
    try:
        res = fwd()
        cp.cuda.Device().synchronize()
    except (RuntimeError, TypeError) as exc:
        return str(exc).splitlines()[0]
    if bwd is None:
        return fwd, None
    try:
        bwd(*res)
        cp.cuda.Device().synchronize()
    except (RuntimeError, TypeError) as exc:
        print(f"# FA2 backward refused: {str(exc).splitlines()[0]}", flush=True)
        bwd = None
    return fwd, bwd


def timed(cases, rounds=3):
    """:func:`bench_variants.interleaved` over the cases, with a backward of ``None`` timed
    as nothing (NaN)."""
    nan_bwd = {name for name, (_, b) in cases.items() if b is None}
    fixed = {name: (f, b if b is not None else (lambda *_: None)) for name, (f, b) in cases.items()}
    ms = bv.interleaved(fixed, rounds=rounds)
    return {name: (f, float("nan") if name in nan_bwd else b) for name, (f, b) in ms.items()}


def row(rows, case, variant, d, pairs, ours, fa2, ours_ref=None, fa2_ref=None, bar_kind="time"):
    """One case: our and FA2's ms and TFLOP/s over ``pairs`` visible pairs; with references
    (the variant's baseline, same kernel family), each side's ratio as the bar measures it."""
    fwd_tf, bwd_tf = tflops(pairs, d, ours)
    r = dict(case=case, variant=variant, ours_fwd_ms=ours[0], ours_bwd_ms=ours[1], ours_fwd_tflops=fwd_tf,
             ours_bwd_tflops=bwd_tf)  # fmt: skip
    if isinstance(fa2, str):
        r["fa2"] = fa2
    else:
        fwd_tf, bwd_tf = tflops(pairs, d, fa2)
        r.update(fa2_fwd_ms=fa2[0], fa2_bwd_ms=fa2[1], fa2_fwd_tflops=fwd_tf, fa2_bwd_tflops=bwd_tf)
    if ours_ref is not None:
        r["bar_kind"] = bar_kind
        r["ours_ref"] = ours_ref  # (fwd, bwd) ms, or TFLOP/s for bar_kind "tflops"
        if fa2_ref is not None and not isinstance(fa2_ref, str):
            r["fa2_ref"] = fa2_ref
    rows.append(r)
    print(json.dumps(r), flush=True)


def tflops(pairs, d, ms):
    """(forward, backward) TFLOP/s of ``pairs`` visible pairs at head dim ``d`` in ``ms``
    milliseconds (4·d FLOPs a pair forward, 2.5× that backward)."""
    fl = 4 * pairs * d
    return (fl / ms[0] / 1e9, 2.5 * fl / ms[1] / 1e9)


def main(path):
    randn, calls = bv.randn, bv.calls
    rows = []
    # GQA (4, 32 q heads / 8 KV heads, 4096, 128) causal vs MHA at the same q shape (torch's op takes fewer
    # KV heads as FlashAttention-2 does)
    B, H, Hk, N, d = 4, 32, 8, 4096, 128
    q, dout = randn(B, N, H, d), randn(B, N, H, d)
    k, v, km, vm = randn(B, N, Hk, d), randn(B, N, Hk, d), randn(B, N, H, d), randn(B, N, H, d)
    cases = {"mha": calls(q, km, vm, dout, causal=True), "gqa": calls(q, k, v, dout, causal=True),
             "fa2 mha": checked(*fa2_calls(q, km, vm, dout, True)),
             "fa2 gqa": checked(*fa2_calls(q, k, v, dout, True))}  # fmt: skip
    ms = timed({n: c for n, c in cases.items() if not isinstance(c, str)})
    get = lambda n: ms.get(n, cases[n])  # noqa: E731 (ms, or torch's refusal)
    pairs = B * H * visible_pairs(N, N, True)
    row(rows, "mha causal 4x32x4096", "mha", d, pairs, ms["mha"], get("fa2 mha"))
    row(rows, "gqa 32/8 causal 4x32x4096", "gqa", d, pairs, ms["gqa"], get("fa2 gqa"), ms["mha"],
        None if isinstance(get("fa2 mha"), str) else get("fa2 mha"))  # fmt: skip
    del q, dout, k, v, km, vm
    # window (1024, 0) vs causal, (1, 16, 16384, 128)
    B, H, N, d = 1, 16, 16384, 128
    q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
    cases = {"causal": calls(q, k, v, dout, causal=True),
             "window": calls(q, k, v, dout, causal=True, window_size=(1024, 0)),
             "fa2 causal": checked(*fa2_calls(q, k, v, dout, True)),
             "fa2 window": checked(*fa2_calls(q, k, v, dout, True, window=(1024, 0)))}  # fmt: skip
    ms = timed({n: c for n, c in cases.items() if not isinstance(c, str)})
    get = lambda n: ms.get(n, cases[n])  # noqa: E731
    cp_, wp = B * H * visible_pairs(N, N, True), B * H * visible_pairs(N, N, True, (1024, 0))
    row(rows, "causal 1x16x16384", "causal", d, cp_, ms["causal"], get("fa2 causal"))
    row(rows, "window (1024,0) 1x16x16384", "window", d, wp, ms["window"], get("fa2 window"),
        tflops(cp_, d, ms["causal"]), None if isinstance(get("fa2 causal"), str) else tflops(cp_, d, ms["fa2 causal"]),
        "tflops")  # fmt: skip
    del q, k, v, dout
    # varlen, 16 ragged sequences (mean 1024, total 16384), causal, vs the batch padded to the longest
    lens = ragged_draw()
    H, d = 16, 128
    total, Np = int(lens.sum()), int(lens.max())
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v, dout = (randn(total, H, d) for _ in range(4))
    qp, kp, vp, dop = (randn(len(lens), Np, H, d) for _ in range(4))
    cases = {"varlen": bv.varlen_calls(q, k, v, dout, cu, Np, causal=True),
             "padded": calls(qp, kp, vp, dop, causal=True),
             "fa2 varlen": checked(*fa2_calls(q, k, v, dout, True, cu=cu, max_len=Np)),
             "fa2 padded": checked(*fa2_calls(qp, kp, vp, dop, True))}  # fmt: skip
    ms = timed({n: c for n, c in cases.items() if not isinstance(c, str)})
    get = lambda n: ms.get(n, cases[n])  # noqa: E731
    vp_, pp = H * sum(visible_pairs(int(n), int(n), True) for n in lens), len(lens) * H * visible_pairs(Np, Np, True)
    row(rows, f"padded 16x{Np}", "padded", d, pp, ms["padded"], get("fa2 padded"))
    row(rows, f"varlen 16 seqs {lens.min()}-{Np}", "varlen", d, vp_, ms["varlen"], get("fa2 varlen"),
        tflops(pp, d, ms["padded"]), None if isinstance(get("fa2 padded"), str) else tflops(pp, d, ms["fa2 padded"]),
        "tflops")  # fmt: skip
    del q, k, v, dout, qp, kp, vp, dop
    # ALiBi, dropout 0.1 and softcap 30 vs plain, (4, 16, 4096, 128) causal (softcap: ours only, not in torch's op)
    B, H, N, d = 4, 16, 4096, 128
    q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
    slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
    cases = {"plain": calls(q, k, v, dout, causal=True),
             "alibi": calls(q, k, v, dout, causal=True, alibi_slopes=slopes),
             "dropout": calls(q, k, v, dout, causal=True, dropout_p=0.1, seed=1234),
             "softcap": calls(q, k, v, dout, causal=True, softcap=30.0),
             "fa2 plain": checked(*fa2_calls(q, k, v, dout, True)),
             # torch's backward op takes no slopes: its ALiBi backward would be plain's (not timed)
             "fa2 alibi": checked(fa2_calls(q, k, v, dout, True, slopes=slopes)[0], None),
             "fa2 dropout": checked(*fa2_calls(q, k, v, dout, True, dropout_p=0.1))}  # fmt: skip
    ms = timed({n: c for n, c in cases.items() if not isinstance(c, str)})
    get = lambda n: ms.get(n, cases[n])  # noqa: E731
    pairs = B * H * visible_pairs(N, N, True)
    fa2_plain = get("fa2 plain")
    row(rows, "plain causal 4x16x4096", "plain", d, pairs, ms["plain"], fa2_plain)
    for name in ("alibi", "dropout", "softcap"):
        fa2 = get(f"fa2 {name}") if name != "softcap" else "not in torch's FlashAttention-2 op"
        row(rows, f"{name} causal 4x16x4096", name, d, pairs, ms[name], fa2, ms["plain"],
            None if isinstance(fa2_plain, str) else fa2_plain)  # fmt: skip
    report(rows, path)


def report(rows, path):
    bv.write_jsonl(rows, path)
    print(f"\n{'case':28} {'ours/FA2 fwd':>12} {'bwd':>6}   {'bar: ours fwd':>13} {'bwd':>6}   "
          f"{'FA2 fwd':>7} {'bwd':>6}")  # fmt: skip
    for r in rows:
        vs = ("", "")
        if "fa2_fwd_ms" in r:
            vs = (f"{r['ours_fwd_ms'] / r['fa2_fwd_ms']:.3f}", f"{r['ours_bwd_ms'] / r['fa2_bwd_ms']:.3f}")
        bar_ours, bar_fa2 = ("", ""), ("", "")
        if "ours_ref" in r:
            if r["bar_kind"] == "tflops":  # the variant's TF/s over its baseline's
                bar_ours = tuple(f"{x / y:.3f}" for x, y in zip((r["ours_fwd_tflops"], r["ours_bwd_tflops"]),
                                                               r["ours_ref"]))  # fmt: skip
                if "fa2_ref" in r:
                    bar_fa2 = tuple(f"{x / y:.3f}" for x, y in zip((r["fa2_fwd_tflops"], r["fa2_bwd_tflops"]),
                                                                  r["fa2_ref"]))  # fmt: skip
            else:  # the variant's time over its baseline's
                bar_ours = (f"{r['ours_fwd_ms'] / r['ours_ref'][0]:.3f}", f"{r['ours_bwd_ms'] / r['ours_ref'][1]:.3f}")
                if "fa2_ref" in r and "fa2_fwd_ms" in r:
                    bar_fa2 = (f"{r['fa2_fwd_ms'] / r['fa2_ref'][0]:.3f}", f"{r['fa2_bwd_ms'] / r['fa2_ref'][1]:.3f}")
        print(f"{r['case']:28} {vs[0]:>12} {vs[1]:>6}   {bar_ours[0]:>13} {bar_ours[1]:>6}   "
              f"{bar_fa2[0]:>7} {bar_fa2[1]:>6}  {r.get('fa2', '')}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])  # options after the path: --queued
