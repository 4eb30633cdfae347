"""Issue #13: the Hopper backward (``kernels.wgmma_backward``) against the mma.sync
backward (``NUMBA_FLASH_WGMMA=0``) and torch SDPA's flash (FlashAttention-2) and cuDNN
backends, same process, fp16 and bf16, the issue's shapes, causal off and on.

    python3 scripts/bench_wgmma_bwd.py out.jsonl [--quick] [--mma] [--pipe-ab]

Each row: medians of CUDA-event timings after warm-up, 10
back-to-back calls between the events ("queued", as torch.utils.benchmark times
FlashAttention-2), of the backward alone (``flash_attention_backward``; SDPA: autograd
of a saved forward); the time of each of our three kernels launched alone
(``kernel_ms``); and the wgmma backward with other ring tiles
(``NUMBA_FLASH_WGMMA_BWD_RING``, fp16 non-causal at N = 4096).  FLOPs 2.5 · 4·B·H·N²·d
(×0.5 causal).  ``--quick``: fp16 only; ``--mma``: the mma.sync backward too (session 24's
``--dq-ab``, dQ summed in dK/dV, went with that kernel in session 38); ``--pipe-ab``: the step
pipelined or not (``NUMBA_FLASH_WGMMA_BWD_PIPE`` 0, 1, 3: ``wgmma_backward.pipelined``) timed
in turn (``pipe{x}_ms``, medians of three; ``pipe{x}_kernel_ms``: each kernel alone), and
whether the pipelined gradients equal the unpipelined ones bit for bit.  The
gradients are checked against the float64 reference by tests/test_wgmma_backward.py.
"""

import json
import os
import sys
from unittest import mock

import cupy as cp
import ml_dtypes
import numpy as np
from bench_table import median_ms

import numba_flash
from numba_flash import api as A

SHAPES = [(4, 16, 4096, 128), (4, 32, 4096, 64), (1, 16, 16384, 128), (16, 32, 1024, 64)]
#: Other ring tiles to time, by head dim ("kv,q" rows a step of dK/dV and of dQ).
RINGS = {128: ["64,128"], 64: ["128,64", "64,64"]}


def queued(fn):
    return median_ms(fn, calls=10, rep=9)


#: ``--pipe-ab``'s modes: ``NUMBA_FLASH_WGMMA_BWD_PIPE``, with "s" the dK/dV kernel's smaller steps
#: (``SMALL``: then it is pipelined too); ``PIPE_AB`` (comma-separated) overrides them.
PIPES = tuple(os.environ.get("PIPE_AB", "0,1,3").split(","))
SMALL = {128: "32,64", 64: "64,128"}


def ours(args, causal, wgmma, ring="", pipe=""):
    os.environ["NUMBA_FLASH_WGMMA"] = "1" if wgmma else "0"
    os.environ["NUMBA_FLASH_WGMMA_BWD_PIPE"] = pipe
    if not pipe:
        del os.environ["NUMBA_FLASH_WGMMA_BWD_PIPE"]
    os.environ["NUMBA_FLASH_WGMMA_BWD_RING"] = ring
    fn = lambda: numba_flash.flash_attention_backward(*args, causal=causal)  # noqa: E731
    grads = fn()
    return queued(fn), grads


def kernel_ms(args, causal):
    """Per kernel of the wgmma plan: its median ms launched alone (10 queued), on the
    buffers one call bound."""
    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    got = {}
    run = A._run

    def capture(plan, buffers, layout, rec=None):
        got.update(plan=plan, buffers=buffers, layout=layout)
        run(plan, buffers, layout)

    from numba_flash import _replay

    # the checked path (a replayed call would not reach ``_run``)
    with mock.patch.object(A, "_run", capture), mock.patch.object(_replay, "ENABLED", False):
        numba_flash.flash_attention_backward(*args, causal=causal)
    from dataclasses import replace

    bufs = got["buffers"]

    def alone(k):
        run(replace(got["plan"], launches=(k,)), bufs, got["layout"])

    return {k.name: queued(lambda k=k: alone(k)) for k in got["plan"].launches}


def sdpa_bwd_ms(q, k, v, dout, causal):
    """(flash, cudnn) queued ms of SDPA's backward (NaN where a backend refuses)."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return float("nan"), float("nan")
    tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2).detach() for x in (q, k, v, dout))
    for t in (tq, tk, tv):
        t.requires_grad_()
    got = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(backend):
                o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                fn = lambda: torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True)  # noqa: E731
                fn()
                got.append(queued(fn))
        except RuntimeError:
            got.append(float("nan"))
    return tuple(got)


def pipe_ab(row, args, causal, fl):
    """The ``--pipe-ab`` columns of ``row``: each ``PIPES`` mode timed in turn, its kernels alone,
    and whether its gradients equal mode 0's bit for bit."""
    times, grads = {x: [] for x in PIPES}, {}
    d = args[1].shape[-1]
    ring = {x: SMALL.get(d, "") if x.endswith("s") else "" for x in PIPES}
    for _ in range(3):
        for x in PIPES:
            ms, g = ours(args, causal, True, ring=ring[x], pipe=x.rstrip("s"))
            times[x].append(ms)
            grads.setdefault(x, g)
    for x in PIPES:
        row[f"pipe{x}_ms"] = float(np.median(times[x]))
        row[f"pipe{x}_tflops"] = fl / row[f"pipe{x}_ms"] / 1e9
        os.environ["NUMBA_FLASH_WGMMA_BWD_PIPE"] = x.rstrip("s")
        os.environ["NUMBA_FLASH_WGMMA_BWD_RING"] = ring[x]
        row[f"pipe{x}_kernel_ms"] = kernel_ms(args, causal)
        row[f"pipe{x}_bitwise"] = all(bool(cp.array_equal(a, b)) for a, b in zip(grads[x], grads[PIPES[0]]))
        row[f"pipe{x}_maxdiff"] = max(float(cp.abs(a.astype(cp.float32) - b.astype(cp.float32)).max())
                                      for a, b in zip(grads[x], grads[PIPES[0]]))  # fmt: skip
    del os.environ["NUMBA_FLASH_WGMMA_BWD_PIPE"]
    os.environ["NUMBA_FLASH_WGMMA_BWD_RING"] = ""


def main(path, quick=False, mma=False, pipe=False):
    rows = []
    dtypes = ("float16",) if quick else ("float16", "bfloat16")
    for dtype in dtypes:
        for B, H, N, d in SHAPES:
            dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
            gen = cp.random.default_rng(13)
            q, k, v, dout = (gen.standard_normal((B, N, H, d), dtype=cp.float32).astype(dt) for _ in range(4))
            for causal in (False, True):
                fl = 2.5 * 4 * B * H * N * N * d * (0.5 if causal else 1.0)
                os.environ["NUMBA_FLASH_WGMMA"] = "1"
                out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
                args = (dout, q, k, v, out, lse)
                wg_ms, _ = ours(args, causal, True)
                fa2, cudnn = sdpa_bwd_ms(q, k, v, dout, causal)
                row = dict(dtype=dtype, B=B, H=H, N=N, d=d, causal=causal, wgmma_ms=wg_ms, sdpa_flash_ms=fa2,
                           sdpa_cudnn_ms=cudnn, tflops=fl / wg_ms / 1e9, vs_fa2=fa2 / wg_ms, vs_cudnn=cudnn / wg_ms,
                           kernel_ms=kernel_ms(args, causal))  # fmt: skip
                if pipe:
                    pipe_ab(row, args, causal, fl)
                if mma:
                    row["mma_ms"] = ours(args, causal, False)[0]
                    row["vs_mma"] = row["mma_ms"] / wg_ms
                if dtype == "float16" and not causal and N == 4096:  # other ring tiles, at the first shape of each d
                    for ring in RINGS[d]:
                        row[f"ring_{ring}_ms"] = ours(args, causal, True, ring)[0]
                os.environ["NUMBA_FLASH_WGMMA_BWD_RING"] = ""
                rows.append(row)
                print(json.dumps(row), flush=True)
                del out, lse, args
            del q, k, v, dout
            cp.get_default_memory_pool().free_all_blocks()
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("\nbackward alone, queued (10 calls between events); TF/s = 2.5·4·B·H·N²·d (×0.5 causal) / time")
    print(f"{'dtype':9} {'B,H,N,d':18} {'causal':6} {'ms':>7} {'TF/s':>6} {'vs FA2':>6} {'vs cuDNN':>8} "
          f"{'vs mma':>6} {'stats/dkdv/dq ms':>20} {'rings (ms)':>24}")
    for r in rows:
        ks = "/".join(f"{x:.3f}" for x in r["kernel_ms"].values())
        rings = " ".join(f"{k[5:-3]}:{v:.3f}" for k, v in r.items() if k.startswith("ring_"))
        print(f"{r['dtype']:9} {str((r['B'], r['H'], r['N'], r['d'])):18} {str(r['causal']):6} {r['wgmma_ms']:7.3f} "
              f"{r['tflops']:6.1f} {r['vs_fa2']:6.3f} {r['vs_cudnn']:8.3f} {r.get('vs_mma', float('nan')):6.3f} "
              f"{ks:>20} {rings:>24}")
    if pipe:
        print("\nthe step pipelined (NUMBA_FLASH_WGMMA_BWD_PIPE 1: two stages, 3: three; s: dK/dV's smaller steps "
              f"{SMALL}, pipelined too) against {PIPES[0]}, in turn; kv / dq = the dK/dV / dQ kernels alone; diff = the "
              "largest gradient difference from the first mode's")
        print(f"{'dtype':9} {'B,H,N,d':18} {'causal':6} " + " ".join(f"{'ms ' + x:>8} {'kv':>6} {'dq':>6}" for x in PIPES) +
              f" {'best':>5} {'/first':>6} {'TF/s':>6} {'vs cuDNN':>8} {'max diff':>8}")
        for r in rows:
            best = min(PIPES, key=lambda x: r[f"pipe{x}_ms"])
            kms = {x: list(r[f"pipe{x}_kernel_ms"].values()) for x in PIPES}
            print(f"{r['dtype']:9} {str((r['B'], r['H'], r['N'], r['d'])):18} {str(r['causal']):6} " +
                  " ".join(f"{r[f'pipe{x}_ms']:8.3f} {sum(kms[x][1:-1]):6.3f} {kms[x][-1]:6.3f}" for x in PIPES) +
                  f" {best:>5} {r[f'pipe{PIPES[0]}_ms'] / r[f'pipe{best}_ms']:6.3f} "
                  f"{r['tflops'] * r['wgmma_ms'] / r[f'pipe{best}_ms']:6.1f} {r['sdpa_cudnn_ms'] / r[f'pipe{best}_ms']:8.3f} "
                  f"{max(r[f'pipe{x}_maxdiff'] for x in PIPES):8.2g}")


if __name__ == "__main__":
    main(sys.argv[1], "--quick" in sys.argv, "--mma" in sys.argv, "--pipe-ab" in sys.argv)
    from numba_flash._numba_cuda import ASSEMBLED

    for how in sorted(set(ASSEMBLED.values())):  # whole_program_dispatcher: what assembled the wgmma kernels
        print(f"{sum(v == how for v in ASSEMBLED.values())} wgmma kernels assembled by {how}")
