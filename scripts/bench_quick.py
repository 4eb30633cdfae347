"""Quick same-process timings on a GPU: numba-flash against torch SDPA (flash for fp16/bf16,
efficient for fp32) at the issue shapes, and the memory of a forward at N = 65536.

    python3 scripts/bench_quick.py [tc] [fp32] [mem]

The full harness is `numba-flash bench`; this is the script behind the first figures in
docs/benchmarks/ (medians of 10 CUDA-event timings after 3 warm-ups; fp32 backward 3).
"""
import sys, json, gc
import numpy as np, cupy as cp, ml_dtypes
import numba_flash
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
F = torch.nn.functional.scaled_dot_product_attention
def timeit(fn, rep=10, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); cp.cuda.runtime.deviceSynchronize()
    ts=[]
    for _ in range(rep):
        s=cp.cuda.Event(); e=cp.cuda.Event(); s.record(); fn(); e.record(); e.synchronize(); ts.append(cp.cuda.get_elapsed_time(s,e))
    return float(np.median(ts))
which = sys.argv[1:] or ["tc", "fp32", "mem"]
if "tc" in which:
  for dt, tdt in ((np.float16, torch.float16), (ml_dtypes.bfloat16, torch.bfloat16)):
    for (B,H,N,d) in ((4,16,4096,128),(4,32,4096,64),(1,16,16384,128),(16,32,1024,64)):
      for causal in (False, True):
        if dt is ml_dtypes.bfloat16 and (B,H,N,d) not in ((4,16,4096,128),(4,32,4096,64)): continue
        tq,tk,tv=(torch.randn(B,N,H,d,device="cuda",dtype=tdt) for _ in range(3))
        q,k,v=(cp.from_dlpack(x.detach()) for x in (tq,tk,tv))
        fl=4*B*H*N*N*d*(0.5 if causal else 1)
        t_nf=timeit(lambda: numba_flash.flash_attention(q,k,v,causal=causal))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            t_fa=timeit(lambda: F(tq.transpose(1,2),tk.transpose(1,2),tv.transpose(1,2),is_causal=causal))
        print(json.dumps(dict(dtype=np.dtype(dt).name,B=B,H=H,N=N,d=d,causal=causal,nf_tflops=round(fl/t_nf/1e9,1),fa2_tflops=round(fl/t_fa/1e9,1),ratio=round(t_fa/t_nf,3))), flush=True)
        del tq,tk,tv,q,k,v; gc.collect()
if "fp32" in which:
  for (B,H,N,d) in ((4,16,4096,128),(4,32,4096,64)):
    for causal in (False, True):
      q,k,v,do=(cp.random.standard_normal((B,N,H,d),dtype=cp.float32) for _ in range(4))
      fl=4*B*H*N*N*d*(0.5 if causal else 1)
      t_f=timeit(lambda: numba_flash.flash_attention(q,k,v,causal=causal), rep=5)
      o,lse=numba_flash.flash_attention(q,k,v,causal=causal,return_lse=True)
      t_b=timeit(lambda: numba_flash.flash_attention_backward(do,q,k,v,o,lse,causal=causal), rep=3, warm=1)
      tq,tk,tv=(torch.randn(B,H,N,d,device="cuda",requires_grad=True) for _ in range(3)); tdo=torch.randn(B,H,N,d,device="cuda")
      with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
          ts_f=timeit(lambda: F(tq,tk,tv,is_causal=causal))
          to=F(tq,tk,tv,is_causal=causal)
          ts_b=timeit(lambda: torch.autograd.grad(to,(tq,tk,tv),tdo,retain_graph=True))
      print(json.dumps(dict(dtype="float32",B=B,H=H,N=N,d=d,causal=causal,nf_fwd=round(fl/t_f/1e9,2),nf_bwd=round(2.5*fl/t_b/1e9,2),sdpa_eff_fwd=round(fl/ts_f/1e9,2),sdpa_eff_bwd=round(2.5*fl/ts_b/1e9,2))), flush=True)
      del q,k,v,do,o,lse,tq,tk,tv,tdo,to; gc.collect(); torch.cuda.empty_cache()
if "mem" in which:
  pool=cp.get_default_memory_pool(); pool.free_all_blocks()
  B,H,N,d=1,1,65536,64
  q,k,v=(cp.random.standard_normal((B,N,H,d),dtype=cp.float32) for _ in range(3))
  cp.cuda.runtime.deviceSynchronize(); before=pool.used_bytes(); pool_before=pool.total_bytes()
  o,lse=numba_flash.flash_attention(q,k,v,return_lse=True); cp.cuda.runtime.deviceSynchronize()
  print(json.dumps(dict(memory_N=N, inputs_bytes=3*q.nbytes, forward_new_bytes=pool.used_bytes()-before, pool_growth=pool.total_bytes()-pool_before, out_plus_lse=o.nbytes+lse.nbytes)))
