"""Session 24: the Hopper backward's ordered dQ (``wgmma_backward.ordered_dq``) case by
case, in one process: one call's time after the compile with the dQ kernel
(``NUMBA_FLASH_WGMMA_DQ=pass``) and with the ordered dQ, and the largest difference of
their dQ (the float64 tests check both).  Run it with ``NUMBA_FLASH_DQ_WATCHDOG=N`` so that
a writer that spins N times on its semaphore prints what it waits for instead of hanging.

    NUMBA_FLASH_DQ_WATCHDOG=2000000 python3 scripts/probe_dq_order.py out.jsonl [B,H,N,d,causal ...]
"""

import json
import os
import sys

import cupy as cp

import numba_flash

#: What to time in turn (``DQ_ORDERS``, comma-separated ``NUMBA_FLASH_WGMMA_DQ`` values; the first is compared).
ORDERS = tuple(os.environ.get("DQ_ORDERS", "pass,ordered,light").split(","))
CASES = ["1,1,4096,128,0", "4,16,4096,128,0", "4,16,4096,128,1", "4,32,4096,64,0", "4,32,4096,64,1",
         "1,16,16384,128,0", "1,16,16384,128,1", "16,32,1024,64,0", "16,32,1024,64,1"]


def main(path, cases):
    rows = []
    for case in cases:
        B, H, N, d, causal = (int(x) for x in case.split(","))
        gen = cp.random.default_rng(1)
        q, k, v, dout = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(cp.float16) for _ in range(4))
        out, lse = numba_flash.flash_attention(q, k, v, causal=bool(causal), return_lse=True)
        row = dict(case=case)
        grads = {}
        times = {}
        for how in ORDERS * 3:  # in turn; each: 5 calls between CUDA events
            os.environ["NUMBA_FLASH_WGMMA_DQ"] = how
            g = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=bool(causal))
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(5):
                g = numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=bool(causal))
            stop.record()
            stop.synchronize()
            times.setdefault(how, []).append(cp.cuda.get_elapsed_time(start, stop) / 5)
            grads[how] = g
        for how, ts in times.items():
            row[f"{how}_ms"] = sorted(ts)[len(ts) // 2]
        for i, name in enumerate(("dq", "dk", "dv")):  # the first two orders' results
            a, b = grads["pass"][i].astype(cp.float32), grads[ORDERS[1]][i].astype(cp.float32)
            row[f"{name}_max_diff"] = float(cp.abs(a - b).max())
            row[f"{name}_max"] = float(cp.abs(a).max())
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, dout, out, lse, grads, g
        cp.get_default_memory_pool().free_all_blocks()
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\n{'B,H,N,d,causal':18} " + " ".join(f"{o + ' ms':>10}" for o in ORDERS) +
          f" {'dq diff':>9} {'max|dq|':>8} {'dk diff':>8}   (NUMBA_FLASH_DQ_PROBE={os.environ.get('NUMBA_FLASH_DQ_PROBE', '')})")
    for r in rows:
        print(f"{r['case']:18} " + " ".join(f"{r[o + '_ms']:10.3f}" for o in ORDERS) +
              f" {r['dq_max_diff']:9.3g} {r['dq_max']:8.3g} {r['dk_max_diff']:8.3g}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or CASES)
