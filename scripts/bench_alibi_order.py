"""Where ALiBi's k-slice goes in the Hopper forward's S chain, timed and checked (issue #11's
ALiBi bar): one process an order, ``NUMBA_FLASH_ALIBI_AFTER`` set by the caller (−1: after
all of Q·Kᵀ's k-slices, the default since session 31; 0: first, the order before it; k:
after the first k).

    NUMBA_FLASH_ALIBI_AFTER=0 python3 scripts/bench_alibi_order.py out.jsonl

The switch existed at ``69a04ed`` only (session 33's call 1 ran there): the other orders ran
1.50–1.60× plain and less exact, so ``a434373`` removed it; at later commits every process
times the default order (still a plain / ALiBi A/B with the LSE check).

Prints and appends one JSON line: the forward's milliseconds, plain causal and causal ALiBi
(4, 16, 4096, 128) fp16, timed in turn over five rounds (10 queued calls, medians; the
slopes 2^-1 … 2^-16 of ``bench_variants``), their ratio, and the ALiBi forward's LSE and O
errors at (1, 1000, 2, 128) with slopes of 2 to 2.5 against the float64 reference (the
LSE's over max(max |ref|, 1), as the tests' ``lse_error``; fp32's bound is 1e-5).
"""

import json
import os
import sys

import cupy as cp
import numpy as np

import numba_flash
from numba_flash import reference as R
from bench_table import median_ms  # scripts/ is on sys.path

rng = np.random.default_rng(20261206)


def lse_error(lse, ref_lse):
    ref = np.abs(np.asarray(ref_lse, dtype=np.float64))
    ref = ref[np.isfinite(ref)]
    return R.max_abs_error(lse, ref_lse) / max(float(ref.max()) if ref.size else 0.0, 1.0)


def main(path):
    after = os.environ.get("NUMBA_FLASH_ALIBI_AFTER", "-1")
    B, H, N, d = 4, 16, 4096, 128
    q, k, v = (cp.asarray(rng.standard_normal((B, N, H, d), dtype=np.float32)).astype(cp.float16) for _ in range(3))
    slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
    cases = {"plain": lambda: numba_flash.flash_attention(q, k, v, causal=True),
             "alibi": lambda: numba_flash.flash_attention(q, k, v, causal=True, alibi_slopes=slopes)}
    for fn in cases.values():
        fn()
    times = {name: [] for name in cases}
    for _ in range(5):
        for name, fn in cases.items():
            times[name].append(median_ms(fn, warmup=1, rep=7, calls=10))
    ms = {name: float(np.median(t)) for name, t in times.items()}
    # accuracy: slopes of 2 to 2.5 (the column term ~v·64 raw), 1000 rows, d = 128
    errs = []
    for _ in range(3):
        qh, kh, vh = (rng.standard_normal((1, 1000, 2, d)).astype(np.float16) for _ in range(3))
        sl = (2.0 + 0.5 * rng.random(2)).astype(np.float32)
        out, lse = numba_flash.flash_attention(cp.asarray(qh), cp.asarray(kh), cp.asarray(vh), causal=True,
                                               alibi_slopes=cp.asarray(sl), return_lse=True)  # fmt: skip
        ref, ref_lse = R.attention(qh, kh, vh, causal=True, alibi_slopes=sl)
        errs.append((lse_error(cp.asnumpy(lse), ref_lse), R.rel_error(cp.asnumpy(out).astype(np.float64), ref)))
    row = {"alibi_after": int(after), "plain_ms": ms["plain"], "alibi_ms": ms["alibi"],
           "ratio": ms["alibi"] / ms["plain"], "lse_err_max": max(e[0] for e in errs),
           "o_err_max": max(e[1] for e in errs), "rounds_ms": times}  # fmt: skip
    print(json.dumps(row))
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"after={after:>3}  plain {ms['plain']:.4f} ms  alibi {ms['alibi']:.4f} ms  ratio {row['ratio']:.3f}  "
          f"lse err {row['lse_err_max']:.2e}  O err {row['o_err_max']:.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
