"""Issue #13's acceptance table: the default fp16/bf16 forward and backward (the Hopper
kernels on sm_90a) against torch SDPA's flash (FlashAttention-2) and cuDNN backends, in
one process, on the issue's 16 rows: (4,16,4096,128), (4,32,4096,64), (1,16,16384,128),
(16,32,1024,64), causal off and on, fp16 and bf16.

    python3 scripts/bench_hopper_bars.py out.jsonl

Each time is the median of three rounds, each round timing ours, FlashAttention-2 and cuDNN
in turn (so that clock drift falls on all three alike); a round's value is
``bench_table.median_ms(fn, calls=10, rep=5)``: CUDA events around 10 back-to-back calls
(the host's time a call hides, as torch.utils.benchmark times FlashAttention-2).  The
backward is ``flash_attention_backward`` from a saved forward; SDPA's is autograd of a
saved output.  FLOPs 4·B·H·N²·d (×0.5 causal, ×2.5 backward).  Bars: forward ≥ 1.0× FA2,
backward ≥ 0.8× FA2; goal ≥ 1.0× cuDNN.
"""

import json
import sys

import cupy as cp
import ml_dtypes
import numpy as np
from bench_table import median_ms

import numba_flash

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]
ROUNDS = 3


def timed(fn):
    return median_ms(fn, calls=10, rep=5, warmup=1)


def sdpa_fns(q, k, v, dout, causal):
    """{backend: (forward fn, backward fn)} of torch SDPA on bshd arrays, None where a
    backend refuses (or torch is missing)."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return {"fa2": None, "cudnn": None}
    tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2).detach() for x in (q, k, v, dout))
    for t in (tq, tk, tv):
        t.requires_grad_()
    got = {}
    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fwd(backend=backend):
            with sdpa_kernel(backend), torch.no_grad():
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        try:
            fwd()
            with sdpa_kernel(backend):
                o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            bwd = lambda o=o: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True)  # noqa: E731
            bwd()
            got[name] = (fwd, bwd)
        except RuntimeError:
            got[name] = None
    return got


def main(path):
    rows = []
    for dtype in ("float16", "bfloat16"):
        dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        for B, H, N, d in SHAPES:
            gen = cp.random.default_rng(13)
            q, k, v, dout = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(dt) for _ in range(4))
            for causal in (False, True):
                fl = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
                out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
                fns = {"ours": (lambda: numba_flash.flash_attention(q, k, v, causal=causal),
                                lambda: numba_flash.flash_attention_backward(dout, q, k, v, out, lse, causal=causal))}
                fns.update(sdpa_fns(q, k, v, dout, causal))
                ms = {(n, p): [] for n in fns for p in (0, 1)}
                for _ in range(ROUNDS):
                    for name, pair in fns.items():
                        for p in (0, 1):
                            ms[name, p].append(timed(pair[p]) if pair else float("nan"))
                med = {key: float(np.median(v)) for key, v in ms.items()}
                row = dict(dtype=dtype, B=B, H=H, N=N, d=d, causal=causal)
                for p, part, f in ((0, "fwd", fl), (1, "bwd", 2.5 * fl)):
                    row.update({f"{part}_ms": med["ours", p], f"{part}_fa2_ms": med["fa2", p],
                                f"{part}_cudnn_ms": med["cudnn", p], f"{part}_tflops": f / med["ours", p] / 1e9,
                                f"{part}_vs_fa2": med["fa2", p] / med["ours", p],
                                f"{part}_vs_cudnn": med["cudnn", p] / med["ours", p]})  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"\nmedians of {ROUNDS} rounds in turn, 10 queued calls between events; bars: forward >= 1.0x FA2, "
          "backward >= 0.8x FA2; goal >= 1.0x cuDNN")
    print("| dtype | (B,H,N,d) | causal | fwd TF/s | fwd / FA2 | fwd / cuDNN | bwd TF/s | bwd / FA2 | bwd / cuDNN | bars |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ok = r["fwd_vs_fa2"] >= 1.0 and r["bwd_vs_fa2"] >= 0.8
        print(f"| {r['dtype']} | ({r['B']},{r['H']},{r['N']},{r['d']}) | {r['causal']} | {r['fwd_tflops']:.1f} | "
              f"{r['fwd_vs_fa2']:.3f} | {r['fwd_vs_cudnn']:.3f} | {r['bwd_tflops']:.1f} | {r['bwd_vs_fa2']:.3f} | "
              f"{r['bwd_vs_cudnn']:.3f} | {'hold' if ok else 'MISSED'} |")


if __name__ == "__main__":
    main(sys.argv[1])
