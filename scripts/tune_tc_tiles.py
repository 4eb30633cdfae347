"""Time tensor-core forward tile shapes (block_m, block_n, warps, m_tiles) against SDPA
flash in one process and write the best per head dim (geometric mean of the ratios) as
JSON, for NUMBA_FLASH_TILES ({"tc_forward": <that JSON>}).

    python3 scripts/tune_tc_tiles.py best_tiles.json
"""
import json, gc, os, sys
import numpy as np, cupy as cp
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
from numba_flash.variant import Variant, variant_args
from numba_flash import _arrays as A
from numba_flash._launch import launch
from numba_flash.config import TcTiles
from numba_flash.kernels import tc_forward
F = torch.nn.functional.scaled_dot_product_attention
def timeit(fn, rep=10, warm=3):
    for _ in range(warm): fn()
    cp.cuda.runtime.deviceSynchronize()
    ts=[]
    for _ in range(rep):
        s=cp.cuda.Event(); e=cp.cuda.Event(); s.record(); fn(); e.record(); e.synchronize(); ts.append(cp.cuda.get_elapsed_time(s,e))
    return float(np.median(ts))
CFG = {64: [(64,64,4,1),(128,64,8,1),(128,64,4,2),(64,64,2,2),(128,128,4,2)], 128: [(64,64,4,1),(64,32,4,1),(128,64,8,1),(128,32,8,1),(64,32,2,2)]}
best = {}
for (B,H,N,d,causal) in ((4,16,4096,128,False),(4,32,4096,64,False),(16,32,1024,64,True)):
    tq,tk,tv=(torch.randn(B,N,H,d,device="cuda",dtype=torch.float16) for _ in range(3))
    q,k,v=(cp.from_dlpack(x) for x in (tq,tk,tv))
    out=cp.empty_like(q); lse=cp.empty((B,H,N),cp.float32)
    fl=4*B*H*N*N*d*(0.5 if causal else 1)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        t_fa=timeit(lambda: F(tq.transpose(1,2),tk.transpose(1,2),tv.transpose(1,2),is_causal=causal))
    args=[x.view(cp.uint16) for x in (q,k,v)]+[out.view(cp.uint32), lse, float(1/np.sqrt(d))] + variant_args()
    for bm,bn,w,mt in CFG[d]:
        t=TcTiles(d,bm,bn,w,m_tiles=mt); kern=tc_forward.tc_forward_kernel(t,causal,"float16")
        try:
            tm=timeit(lambda: launch(kern,((N+bm-1)//bm,H,B),t.threads,tc_forward.smem_bytes(t),*args))
            regs=[int(x) for x in kern.get_regs_per_thread().values()]
            r=dict(B=B,H=H,N=N,d=d,causal=causal,tiles=[bm,bn,w,mt],smem=tc_forward.smem_bytes(t),regs=regs,tflops=round(fl/tm/1e9,1),fa2=round(fl/t_fa/1e9,1),ratio=round(t_fa/tm,3))
            print(json.dumps(r),flush=True)
            key=str(d); score=r["ratio"]
            best.setdefault(key,{}); best[key][str([bm,bn,w,mt])]=best[key].get(str([bm,bn,w,mt]),0)+np.log(score)
        except Exception as e:
            print("FAIL", d, bm,bn,w,mt, repr(e)[:300], flush=True)
    del tq,tk,tv,q,k,v,out,lse; gc.collect()
choice={d: json.loads(max(v, key=v.get)) for d, v in best.items()}
print("BEST", json.dumps(choice))
open(sys.argv[1] if len(sys.argv)>1 else "/tmp/best_tiles.json","w").write(json.dumps(choice))
