"""SASS of a forward or backward kernel for sm_90a, assembled as the driver's JIT does
(whole program), without a GPU: opcode counts, HGMMA / WARPGROUP.DEPBAR counts and the
spills (needs ptxas and nvdisasm: ``pip install nvidia-cuda-nvdisasm``).

    python3 scripts/sass_count.py forward float16 128 causal '{"dropout": true}' [--dump x.sass]

Compare variants: the opcodes a variant adds to the kernel (static counts, not per
iteration).  The key loop's share: lines between the loop's first HGMMA and its branch
back are not found automatically; ``--dump`` writes the SASS to read them.
"""

import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from numba_flash._numba_cuda import driver_ptx
from numba_flash.inspection import _ptxas_release, inspect_kernels, ptxas_candidates


def nvdisasm() -> str:
    for cand in ["nvdisasm"] + glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "*",
                                                       "bin", "nvdisasm")):  # fmt: skip
        try:
            subprocess.run([cand, "--version"], capture_output=True, check=True)
            return cand
        except (OSError, subprocess.CalledProcessError):
            continue
    raise SystemExit("no nvdisasm (pip install nvidia-cuda-nvdisasm)")


def sass_of(ptx: str) -> tuple[str, str]:
    exe = ptxas_candidates()[0]
    with tempfile.TemporaryDirectory() as tmp:
        src, cub = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(driver_ptx(ptx, _ptxas_release(exe)))
        p = subprocess.run([exe, "-arch=sm_90a", "-v", src, "-o", cub], capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr)
        return subprocess.run([nvdisasm(), "-c", cub], capture_output=True, text=True, check=True).stdout, p.stderr


def opcodes(sass: str) -> collections.Counter:
    c = collections.Counter()
    for ln in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln)
        if m:
            c[m.group(1).split(".")[0]] += 1
    return c


def main(argv):
    pass_, dtype, d, causal = argv[0], argv[1], int(argv[2]), argv[3] == "causal"
    variants = json.loads(argv[4]) if len(argv) > 4 and not argv[4].startswith("--") else {}
    dump = argv[argv.index("--dump") + 1] if "--dump" in argv else None
    for rep in inspect_kernels(pass_, dtype, d, causal, arch="sm_90a", variants=variants):
        if "wgmma" not in rep.name:
            continue
        sass, log = sass_of(rep.ptx)
        if dump:
            with open(dump, "w") as f:
                f.write(sass)
        c = opcodes(sass)
        spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        regs = re.findall(r"Used (\d+) registers", log)
        print(json.dumps(dict(kernel=rep.name, variants=variants, causal=causal, total=sum(c.values()),
                              regs=regs, spills=spill, top=c.most_common(28))))  # fmt: skip
        for lo, hi, body in loops(sass)[:3]:
            print(json.dumps(dict(loop=[hex(lo), hex(hi)], n=sum(body.values()), top=body.most_common(24))))




def loops(sass: str):
    """``(start, end, opcode counts)`` of each backward branch's range that holds an
    HGMMA (the key loops), shortest first."""
    lines, labels, pending = [], {}, []
    for ln in sass.splitlines():
        lab = re.match(r"\s*(\.L_x_\d+):", ln)
        if lab:
            pending.append(lab.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", ln)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            lines.append((addr, m.group(2).split(".")[0], m.group(3)))
    out = []
    for addr, op, rest in lines:
        t = re.search(r"(\.L_x_\d+)", rest) if op == "BRA" else None
        if t is None or labels.get(t.group(1), addr) >= addr:
            continue
        body = [o for a, o, _ in lines if labels[t.group(1)] <= a <= addr]
        if "HGMMA" in body:
            out.append((labels[t.group(1)], addr, collections.Counter(body)))
    return sorted(out, key=lambda x: x[1] - x[0])


if __name__ == "__main__":
    main(sys.argv[1:])
