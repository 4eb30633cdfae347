"""Normalised PTX of a matrix of plan kernels, one JSON line each (no GPU needed).

Compare two checkouts: a change that must not touch the kernels it does not target
(a new variant whose flag is off) gives the same digests.  Mangled names and the
parameter declarations are dropped (a new, unused kernel parameter changes only
those), so the digest is of the instructions.

    python scripts/ptx_digest.py > a.jsonl   (in each checkout; then diff)
"""

import hashlib
import json
import re
import sys

from numba_flash.inspection import inspect_kernels

CASES = [(p, dt, d, c, tf, v) for p in ("forward", "backward") for (dt, d, tf) in
         (("float16", 64, False), ("float16", 128, False), ("bfloat16", 96, False), ("float16", 200, False),
          ("float32", 64, False), ("float32", 64, True), ("float32", 128, False), ("float32", 256, False))
         for c in (False, True) for v in ({}, {"softcap": True, "alibi": True, "gqa": True, "dropout": True})]


def normalise(ptx: str) -> str:
    body = ptx[ptx.index(".entry"):]
    lines = [ln.strip() for ln in body.splitlines()]
    lines = [re.sub(r"_Z\w+", "K", ln) for ln in lines if ln and not ln.startswith(".param")]
    return "\n".join(lines)


if __name__ == "__main__":
    sel = CASES if len(sys.argv) < 2 else CASES[int(sys.argv[1])::int(sys.argv[2])]
    for p, dt, d, c, tf, v in sel:
        for r in inspect_kernels(p, dt, d, c, tf32=tf, variants=v):
            text = normalise(r.ptx)
            print(json.dumps(dict(case=[p, dt, d, c, tf, sorted(v)], kernel=r.name, regs=r.registers,
                                  local=r.local_bytes_ptx, n=len(text.splitlines()),
                                  digest=hashlib.sha256(text.encode()).hexdigest()[:16])), flush=True)
