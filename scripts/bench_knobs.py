"""Issue #11's window and ALiBi rows under the Hopper forward's switches, one process a
setting (the switches are read when a call is planned; the caller sets them):

    NUMBA_FLASH_WGMMA_SCHEDULER=static python3 scripts/bench_knobs.py out.jsonl window LABEL
    NUMBA_FLASH_ALIBI_PRODUCTS=0 python3 scripts/bench_knobs.py out.jsonl alibi LABEL

``window``: (1, 16, 16384, 128) fp16, causal and window (1024, 0), forward and backward,
timed in turn over three rounds (10 queued calls, medians), visible TFLOP/s and the
window's ratio to causal (the bar: ≥ 0.9).  ``alibi``: (4, 16, 4096, 128) causal, plain and
ALiBi (slopes 2^-1 … 2^-16), forward and backward, five rounds, ALiBi's time over plain's
(the bar: ≤ 1.10).  ``short``: four short shapes' forward and backward (512 and 1024 rows),
three rounds each, TFLOP/s (the persistent dK/dV kernel's A/B; no ratio).  ``shapes``: issue
#13's (4, 16, 4096, 128), (4, 32, 4096, 64) and (16, 32, 1024, 64), full and causal, the
same way (session 34's A/B of the descriptor adds, a switch since removed).  ``walks``:
``window``'s two and 16 varlen sequences (NumPy offsets, mean 1024) against the padded batch
of the same tokens, three rounds, both ratios (session 34's A/B of two Q buffers and of the descriptor adds, switches
since removed).  ``batched``: (16, 16, 1024 / 1536, 128) and (8, 16, 2048, 128) causal, and
(4, 16, 4096, 128) causal as a control, the same way as ``shapes`` (session 36's A/B of
``NUMBA_FLASH_L2_SECTIONS=unshared``, then opt-in, since the default; ``=shared`` is the old
rule).  ``varlen``: the varlen row's two parts apart: 16 ragged sequences (mean 1024, as
``walks``) against their padded batch, and 16 sequences of 1024 rows as varlen
against the (16, 16, 1024, 128) batch, causal, three rounds, both ratios (session 36: how much
of the varlen row's gap is the mix of lengths, how much varlen's own costs); with
``KNOBS_NO_ZEROS=1`` (a diagnostic: the results stay exact only while every row is finite) the
Hopper kernels skip the producer's zeroing of rows past a sequence (``hopper.past_rows``
returns "none"), and the row carries digests of the ragged batch's out and dq, which must
match the default's.  Appends one JSON line and prints a one-line summary.
"""

import hashlib
import json
import os
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash.bench.cases import ragged_lengths, visible_pairs
from bench_table import median_ms  # scripts/ is on sys.path

if os.environ.get("KNOBS_NO_ZEROS") == "1":  # before any kernel is built (and none from the disk cache)
    os.environ["NUMBA_FLASH_CACHE"] = "0"
    from numba_flash._numba_cuda import device_function
    from numba_flash.kernels import wgmma_backward, wgmma_forward

    @device_function
    def no_zeros(start, ROWS, seqlen, row0, total, F):
        """``hopper.past_rows`` that zeroes nothing (the diagnostic above)."""
        return ROWS

    wgmma_forward.past_rows = wgmma_backward.past_rows = no_zeros

rng = np.random.default_rng(20261206)


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


def timed(cases, rounds):
    """``{name: (forward ms, backward ms)}``, every case timed in turn each round (medians)."""
    outs = {name: fn() for name, fn in cases.items()}
    times = {name: ([], []) for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name][0].append(median_ms(fn, warmup=1, rep=7, calls=10))
            times[name][1].append(median_ms(outs[name][1], warmup=1, rep=7, calls=10))
    return {name: (float(np.median(f)), float(np.median(b))) for name, (f, b) in times.items()}


def case(q, k, v, dout, **kw):
    """A forward that returns (out, lse), with a backward of that output as its second item."""
    def fwd():
        out, lse = numba_flash.flash_attention(q, k, v, return_lse=True, **kw)
        return out, lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, **kw)
    return fwd


def shape_rows(shapes):
    """``(ms, tflops)`` by name of each ``(B, H, N, d, causal)``: forward and backward, three
    rounds each (fresh inputs a shape)."""
    ms, tf = {}, {}
    for B, H, N, d, causal in shapes:
        q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
        name = f"{B}x{H}x{N}x{d}{' causal' if causal else ''}"
        ms.update(timed({name: case(q, k, v, dout, causal=causal)}, 3))
        pairs = B * H * visible_pairs(N, N, causal)
        tf[name] = (4 * d * pairs / ms[name][0] / 1e9, 10 * d * pairs / ms[name][1] / 1e9)
        del q, k, v, dout
    return ms, tf


def main(path, group, label):
    if group == "window":
        B, H, N, d = 1, 16, 16384, 128
        q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
        ms = timed({"causal": case(q, k, v, dout, causal=True),
                    "window": case(q, k, v, dout, causal=True, window_size=(1024, 0))}, 3)
        pairs = {"causal": B * H * visible_pairs(N, N, True), "window": B * H * visible_pairs(N, N, True, (1024, 0))}
        tf = {n: (4 * d * pairs[n] / ms[n][0] / 1e9, 10 * d * pairs[n] / ms[n][1] / 1e9) for n in ms}
        ratio = (tf["window"][0] / tf["causal"][0], tf["window"][1] / tf["causal"][1])
    elif group == "alibi":
        B, H, N, d = 4, 16, 4096, 128
        q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
        slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
        ms = timed({"plain": case(q, k, v, dout, causal=True),
                    "alibi": case(q, k, v, dout, causal=True, alibi_slopes=slopes)}, 5)
        tf = {}
        ratio = (ms["alibi"][0] / ms["plain"][0], ms["alibi"][1] / ms["plain"][1])
    elif group == "walks":
        # the short walks (session 34): window (1024, 0) against causal at
        # (1, 16, 16384, 128), and 16 varlen sequences (NumPy offsets, lengths of mean 1024)
        # against the padded batch of the same tokens, as bench_variants.py's rows
        B, H, N, d = 1, 16, 16384, 128
        q, k, v, dout = (randn(B, N, H, d) for _ in range(4))
        cases = {"causal": case(q, k, v, dout, causal=True),
                 "window": case(q, k, v, dout, causal=True, window_size=(1024, 0))}
        pairs = {"causal": B * H * visible_pairs(N, N, True), "window": B * H * visible_pairs(N, N, True, (1024, 0))}
        lens = ragged_lengths(rng)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        n_max = int(lens.max())
        vq, vk, vv, vdo = (randn(int(lens.sum()), H, d) for _ in range(4))

        def varlen():
            out, lse = numba_flash.flash_attention_varlen(vq, vk, vv, cu, cu, n_max, n_max, causal=True,
                                                          return_lse=True)  # fmt: skip
            return out, lambda: numba_flash.flash_attention_varlen_backward(vdo, vq, vk, vv, out, lse, cu, cu, n_max,
                                                                            n_max, causal=True)  # fmt: skip

        pq, pk, pv, pdo = (randn(len(lens), n_max, H, d) for _ in range(4))
        cases.update(padded=case(pq, pk, pv, pdo, causal=True), varlen=varlen)
        pairs.update(padded=len(lens) * H * visible_pairs(n_max, n_max, True),
                     varlen=H * sum(visible_pairs(int(n), int(n), True) for n in lens))
        ms = timed(cases, 3)
        tf = {n: (4 * d * pairs[n] / ms[n][0] / 1e9, 10 * d * pairs[n] / ms[n][1] / 1e9) for n in ms}
        ratio = (tf["window"][0] / tf["causal"][0], tf["window"][1] / tf["causal"][1],
                 tf["varlen"][0] / tf["padded"][0], tf["varlen"][1] / tf["padded"][1])
    elif group == "varlen":
        H, d = 16, 128
        lens = ragged_lengths(rng)
        cases, pairs, digests = {}, {}, {}
        for name, ls in (("ragged", lens), ("uniform", np.full(16, 1024))):
            cu = np.concatenate([[0], np.cumsum(ls)]).astype(np.int32)
            n_max = int(ls.max())
            vq, vk, vv, vdo = (randn(int(ls.sum()), H, d) for _ in range(4))

            def varlen(vq=vq, vk=vk, vv=vv, vdo=vdo, cu=cu, n_max=n_max):
                out, lse = numba_flash.flash_attention_varlen(vq, vk, vv, cu, cu, n_max, n_max, causal=True,
                                                              return_lse=True)  # fmt: skip
                return out, lambda: numba_flash.flash_attention_varlen_backward(vdo, vq, vk, vv, out, lse, cu, cu,
                                                                                n_max, n_max, causal=True)  # fmt: skip

            if name == "ragged":
                out, bwd = varlen()
                digests = {"out": hashlib.sha1(cp.asnumpy(out).tobytes()).hexdigest()[:12],
                           "dq": hashlib.sha1(cp.asnumpy(bwd()[0]).tobytes()).hexdigest()[:12]}
            pq, pk, pv, pdo = (randn(len(ls), n_max, H, d) for _ in range(4))
            cases.update({f"{name}_padded": case(pq, pk, pv, pdo, causal=True), f"{name}_varlen": varlen})
            pairs.update({f"{name}_padded": len(ls) * H * visible_pairs(n_max, n_max, True),
                          f"{name}_varlen": H * sum(visible_pairs(int(n), int(n), True) for n in ls)})
        ms = timed(cases, 3)
        tf = {n: (4 * d * pairs[n] / ms[n][0] / 1e9, 10 * d * pairs[n] / ms[n][1] / 1e9) for n in ms}
        ratio = tuple(tf[f"{n}_varlen"][i] / tf[f"{n}_padded"][i] for n in ("ragged", "uniform") for i in (0, 1))
    elif group == "short":
        # short walks of the backward's dK/dV blocks: 512 and 1024 rows, causal and not
        ms, tf = shape_rows([(16, 32, 1024, 64, True), (16, 16, 1024, 128, True), (16, 16, 1024, 128, False),
                             (32, 16, 512, 128, True)])
        ratio = (0.0, 0.0)
    elif group == "batched":
        # batches of mid-length sequences whose forward streams a K/V head a block
        # (``spec.l2_sections``' ``unshared``, sessions 35-36), and (4, 16, 4096, 128) as a control
        # (two blocks a stream: the rule leaves it in one section)
        ms, tf = shape_rows([(16, 16, 1024, 128, True), (16, 16, 1536, 128, True), (8, 16, 2048, 128, True),
                             (4, 16, 4096, 128, True)])
        ratio = (0.0, 0.0)
    elif group == "shapes":
        # issue #13's shapes (a switch that touches every Hopper kernel), full and causal
        ms, tf = shape_rows([(B, H, N, d, c) for B, H, N, d in ((4, 16, 4096, 128), (4, 32, 4096, 64), (16, 32, 1024, 64))
                             for c in (False, True)])
        ratio = (0.0, 0.0)
    else:
        raise SystemExit(f"group={group!r}: expected window, walks, varlen, alibi, short, shapes or batched")
    row = {"group": group, "label": label, "ms": ms, "tflops": tf, "ratio": ratio}
    if group == "varlen":
        row["digests"] = digests
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    print(f"{group:7s} {label:16s} " + "  ".join(f"{n} {f:.4f}/{b:.4f} ms" for n, (f, b) in ms.items())
          + f"  ratio fwd {ratio[0]:.3f} bwd {ratio[1]:.3f}"
          + (f"  varlen/padded fwd {ratio[2]:.3f} bwd {ratio[3]:.3f}" if len(ratio) > 2 else ""))
    if group == "varlen":
        print(f"varlen  {label:16s} ragged varlen/padded fwd {ratio[0]:.3f} bwd {ratio[1]:.3f}  uniform (16 x 1024) "
              f"varlen/padded fwd {ratio[2]:.3f} bwd {ratio[3]:.3f}  digests {digests}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
