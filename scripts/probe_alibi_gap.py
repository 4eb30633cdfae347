"""Where ALiBi's forward time goes outside its kernel (session 47): session 47's trace had
ALiBi's kernel span 3 % over plain's but its queued time a call 7 % over.  Times, fp16,
causal, (4, 16, 4096, 128), 10 queued calls between events, seven interleaved rounds:

    plain            the plain forward
    plain + copy     the plain forward and a (4, 16) float32 broadcast copy a call (the copy
                     ``check_alibi`` makes of (heads,) slopes)
    alibi (H,)       ALiBi with (heads,) slopes (a copy kernel a call)
    alibi (B, H)     ALiBi with contiguous (batch, heads) slopes (the copy returns them as is)

    python3 scripts/probe_alibi_gap.py
"""

import cupy as cp
import numpy as np

import bench_variants as bv

B, H, N, d = 4, 16, 4096, 128
q, k, v, dout = (bv.randn(B, N, H, d) for _ in range(4))
s1 = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
s2 = cp.ascontiguousarray(cp.broadcast_to(s1, (B, H)))
plain = bv.calls(q, k, v, dout, causal=True)[0]


def plain_copy():
    plain()
    return cp.ascontiguousarray(cp.broadcast_to(s1, (B, H)))


cases = {"plain": plain, "plain + copy": plain_copy,
         "alibi (H,)": bv.calls(q, k, v, dout, causal=True, alibi_slopes=s1)[0],
         "alibi (B, H)": bv.calls(q, k, v, dout, causal=True, alibi_slopes=s2)[0]}  # fmt: skip
for f in cases.values():
    f()
ms = {n: [] for n in cases}
for _ in range(7):
    for n, f in cases.items():
        ms[n].append(bv.queued_ms(f))
base = np.median(ms["plain"])
for n, x in ms.items():
    print(f"{n:14} {np.median(x):.4f} ms  {np.median(x) / base:.3f}x plain  " + " ".join(f"{t:.4f}" for t in x))
