"""Issue #13's SASS instruction mix of the wgmma forward, for the shapes under cuDNN.

    python3 scripts/sass_mix.py assemble DIR   # here, no GPU: PTX (inspection, sm_90a) -> ptxas -> DIR/*.cubin
    python3 scripts/sass_mix.py assemble_backward DIR   # the same for the backward's dK/dV and dQ kernels
    python3 scripts/sass_mix.py assemble_variants DIR   # d = 128 causal, plain / softcap / dropout, both passes
    python3 scripts/sass_mix.py assemble_masks DIR   # the built-in masks' configurations (MASK_CASES), both passes
    python3 scripts/sass_mix.py count DIR      # the opcode table (cuobjdump, or nvdisasm: pip install nvidia-cuda-nvdisasm)
    python3 scripts/sass_mix.py loops DIR      # each kernel's key loops: opcodes between a branch back and its target
    python3 scripts/sass_mix.py waits DIR      # the forward's key loop: what runs under P·V, what with no wgmma

``assemble`` compiles the plan's kernel for fp16 in the configurations the issue's
shapes run (``CASES``: d = 128 persistent; d = 64 three consumers a block a tile, and
causal at 1024 rows two consumers persistent), and assembles each PTX as a whole program with ``ptxas -arch=sm_90a`` (the
driver's JIT does the same on the GPU: ``_numba_cuda.whole_program_dispatcher``; the
PTX ``.version`` lowered to the ptxas's, ``driver_ptx``).  ``count`` disassembles each
cubin (``cuobjdump -sass``) and prints static opcode counts: HGMMA (wgmma), the TMA
loads (UTMALDG), mbarrier traffic (SYNCS), local memory (LDL/STL, spills: should be 0),
MUFU.EX2, the FP32 pipes and the total.  ``loops`` prints, per kernel, each backward
branch's range that holds an HGMMA (the key loops, shortest first) with its opcode counts
(static, every path of the loop body: a masked tile's branch included).
"""

import collections
import glob
import os
import re
import subprocess
import sys

OPS = ["HGMMA", "UTMALDG", "SYNCS", "LDL", "STL", "LDG", "STG", "LDS", "STS", "MUFU", "FFMA", "FMUL", "FADD",
       "FMNMX", "F2FP", "SHFL", "BAR", "WARPGROUP", "BRA", "FSEL", "LOP3", "IMAD", "IADD3", "PRMT", "ISETP",
       "SHF"]  # fmt: skip


#: (d, causal, query rows, persistent): what (4, 16, 4096, 128), (1, 16, 16384, 128),
#: (4, 32, 4096, 64) and (16, 32, 1024, 64) run (``wgmma_forward.consumers`` and ``blocks``;
#: the inspected problem has one head, so persistence is asked for: three blocks).
CASES = [(128, False, 4096, True), (128, True, 4096, True), (64, False, 4096, False), (64, True, 4096, False),
         (64, True, 1024, True)]  # fmt: skip


def assemble(out):
    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    from numba_flash.inspection import inspect_kernels

    os.makedirs(out, exist_ok=True)
    for d, causal, rows, persistent in CASES:
        os.environ["NUMBA_FLASH_WGMMA_PERSISTENT"] = "3" if persistent else "0"
        (r,) = inspect_kernels("forward", "float16", d, causal, arch="sm_90a", seqlen_q=rows)
        name = (f"{out}/wgmma_forward_d{d}_{'causal' if causal else 'full'}_{rows}_"
                f"{'persistent' if persistent else 'block_a_tile'}")  # fmt: skip
        _ptxas(name, r.ptx)


#: (d, causal) of the backward's kernels (``wgmma_backward``: no persistence, one tile shape a head dim).
BACKWARD_CASES = [(128, False), (128, True), (64, False), (64, True)]


def assemble_backward(out):
    """``assemble`` for the Hopper backward's dK/dV and dQ kernels (fp16)."""
    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    from numba_flash.inspection import inspect_kernels

    os.makedirs(out, exist_ok=True)
    for d, causal in BACKWARD_CASES:
        for r in inspect_kernels("backward", "float16", d, causal, arch="sm_90a", seqlen_q=4096):
            if not r.name.startswith("wgmma"):
                continue
            name = f"{out}/{r.name}_d{d}_{'causal' if causal else 'full'}"
            _ptxas(name, r.ptx)


#: The variants whose per-element cost issue #11 bounds (softcap ≤ 1.10×, dropout ≤ 1.15× plain).
VARIANT_CASES = {"plain": {}, "softcap": {"softcap": True}, "dropout": {"dropout": True}, "alibi": {"alibi": True}}


def assemble_variants(out):
    """``assemble`` for d = 128 causal, forward and backward, plain and each variant."""
    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    os.environ["NUMBA_FLASH_WGMMA_PERSISTENT"] = "3"
    from numba_flash.inspection import inspect_kernels

    os.makedirs(out, exist_ok=True)
    for label, variants in VARIANT_CASES.items():
        for pass_ in ("forward", "backward"):
            for r in inspect_kernels(pass_, "float16", 128, True, arch="sm_90a", variants=variants, seqlen_q=4096):
                if r.name.startswith("wgmma"):
                    _ptxas(f"{out}/{r.name}_{label}", r.ptx)


#: The configurations whose key loops hold a masked tile's branch (causal, a window, with softcap),
#: as the issue's shapes plan them (4096 query rows; d = 64 three consumers, a block a tile; d = 128
#: persistent):
#: label -> (d, causal, variants).  Session 28's lane frame (``mask.frame``) is measured on them.
MASK_CASES = {
    "d64_causal": (64, True, {}), "d64_causal_softcap": (64, True, {"softcap": True}),
    "d64_causal_window": (64, True, {"window_left": True}),
    "d64_window_softcap": (64, False, {"softcap": True, "window_left": True}),
    "d128_causal": (128, True, {}), "d128_causal_window": (128, True, {"window_left": True}),
    "d128_causal_softcap": (128, True, {"softcap": True}),
    "d128_every_variant": (128, True, {"softcap": True, "alibi": True, "dropout": True, "window_left": True,
                                       "gqa": True, "varlen": True}),
}  # fmt: skip


def assemble_masks(out):
    """``assemble`` for :data:`MASK_CASES`, forward and backward (the Hopper kernels)."""
    os.environ["NUMBA_FLASH_WGMMA"] = "1"
    from numba_flash.inspection import inspect_kernels

    os.makedirs(out, exist_ok=True)
    for label, (d, causal, variants) in MASK_CASES.items():
        os.environ["NUMBA_FLASH_WGMMA_PERSISTENT"] = "3" if d == 128 else "0"  # as ``CASES``
        for pass_ in ("forward", "backward"):
            for r in inspect_kernels(pass_, "float16", d, causal, arch="sm_90a", variants=variants, seqlen_q=4096):
                if r.name.startswith("wgmma"):
                    _ptxas(f"{out}/{r.name}_{label}", r.ptx)


def _ptxas(name, ptx):
    """Assemble ``ptx`` whole (``.version`` 9.0, as the driver gets it) to ``name``.cubin; report registers and spills."""
    with open(name + ".ptx", "w") as f:
        f.write(re.sub(r"^\.version \d+\.\d+", ".version 9.0", ptx, flags=re.M))
    log = subprocess.run(["ptxas", "-arch=sm_90a", "-v", name + ".ptx", "-o", name + ".cubin"],
                         capture_output=True, text=True, check=True).stderr  # fmt: skip
    used = re.search(r"Used (\d+) registers", log).group(1)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()
    print(f"{os.path.basename(name)}: {used} registers at launch (setmaxnreg raises the consumers'), "
          f"spill stores/loads {spills[0]}/{spills[1]} bytes")  # fmt: skip
    os.remove(name + ".ptx")


def _sass(cubin):
    """The SASS of ``cubin``: ``cuobjdump -sass`` (the GPU machine), else ``nvdisasm -c``
    (``pip install nvidia-cuda-nvdisasm`` puts one in site-packages' ``nvidia/*/bin``)."""
    here = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "*", "bin", "nvdisasm"))
    for cmd in (["cuobjdump", "-sass"], ["nvdisasm", "-c"], *([exe, "-c"] for exe in here)):
        try:
            return subprocess.run(cmd + [cubin], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
    raise SystemExit("no cuobjdump or nvdisasm (pip install nvidia-cuda-nvdisasm)")


def count(out):
    rows = []
    for cubin in sorted(glob.glob(f"{out}/*.cubin")):
        sass = _sass(cubin)
        ops = collections.Counter()
        for line in sass.splitlines():
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
            if m:
                ops[m.group(1)] += 1
        total = sum(ops.values())
        rows.append((os.path.basename(cubin)[:-6], {op: sum(n for o, n in ops.items() if o.split(".")[0] == op)
                                                    for op in OPS}, total))  # fmt: skip
        # opcodes carry no suffix in cuobjdump's first token (HGMMA.64x128x16...): split on "."
    width = max(len(r[0]) for r in rows)
    print("kernel".ljust(width), *(f"{op:>9}" for op in OPS), f"{'total':>7}")
    for name, ops, total in rows:
        print(name.ljust(width), *(f"{ops[op]:>9}" for op in OPS), f"{total:>7}")


def sass_lines(sass):
    """``(instructions, labels)`` of a disassembly: ``(address, line)`` of each instruction in
    order, and each nvdisasm ``.L_x_N`` label's address (the instruction after it)."""
    ins, labels, pending = [], {}, []
    for ln in sass.splitlines():
        lab = re.match(r"\s*(\.L_x_\d+):", ln)
        if lab:
            pending.append(lab.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s", ln)
        if m:
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            ins.append((addr, ln))
    return ins, labels


def key_loops(sass):
    """``(start, end, opcode counts)`` of each backward branch's range that holds an
    HGMMA, shortest first (branch targets are nvdisasm's ``.L_x_N`` labels)."""
    ins, labels = sass_lines(sass)
    lines = []
    for addr, ln in ins:
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", ln)
        if m:
            lines.append((addr, m.group(1).split(".")[0], m.group(2)))
    out = []
    for addr, op, rest in lines:
        t = re.search(r"(\.L_x_\d+)", rest) if op == "BRA" else None
        if t is None or labels.get(t.group(1), addr) >= addr:
            continue
        body = collections.Counter(o for a, o, _ in lines if labels[t.group(1)] <= a <= addr)
        if body["HGMMA"]:
            out.append((labels[t.group(1)], addr, body))
    return sorted(out, key=lambda x: x[1] - x[0])


def loops(out):
    for cubin in sorted(glob.glob(f"{out}/*.cubin")):
        for lo, hi, body in key_loops(_sass(cubin))[:3]:
            print(f"{os.path.basename(cubin)[:-6]} {lo:#x}-{hi:#x}: {sum(body.values())} instructions,",
                  ", ".join(f"{op} {n}" for op, n in body.most_common(16)))


def waits(out):
    """Per forward cubin, per key loop (its ``WARPGROUP.DEPBAR.LE gsb0, 0x1``, the wait for
    S): the instructions from there to the ``DEPBAR.LE gsb0, 0x0`` (the wait for the
    previous tile's P·V: these run under it), with their MUFU.EX2 and MUFU.TANH; and the
    step's instructions the consumer issues with none of its wgmma in flight: from that
    wait to the loop's branch back, plus from the loop's top to its first
    ``WARPGROUP.ARRIVE`` (with the FMULs of acc's rescale among them).  Static counts: a
    masked tile's branch included.  ``NUMBA_FLASH_WGMMA_HOLD=n … assemble_variants``
    builds the kernels with ``wgmma_forward.hold_exponentials``."""
    for cubin in sorted(glob.glob(f"{out}/wgmma_forward*.cubin")):
        lines, labels = sass_lines(_sass(cubin))
        addr, ins = [a for a, _ in lines], [ln for _, ln in lines]

        def n(a, b, op):
            return sum(op in ins[i] for i in range(a, b))

        for i1 in (i for i, ln in enumerate(ins) if "DEPBAR.LE gsb0, 0x1" in ln):
            i0 = next(i for i in range(i1 + 1, len(ins)) if "DEPBAR.LE gsb0, 0x0" in ins[i])
            back = next(i for i in range(i0, len(ins)) if (m := re.search(r"BRA.*`\((\.L_x_\d+)\)", ins[i]))
                        and labels.get(m.group(1), 1 << 40) < addr[i1])  # fmt: skip
            top = addr.index(labels[re.search(r"`\((\.L_x_\d+)\)", ins[back]).group(1)])
            arrive = next(i for i in range(top, i1) if "WARPGROUP.ARRIVE" in ins[i])
            print(f"{os.path.basename(cubin)[:-6]}: under P·V {i0 - i1} instructions (EX2 {n(i1, i0, 'MUFU.EX2')}, "
                  f"TANH {n(i1, i0, 'MUFU.TANH')}); none in flight {back - i0 + arrive - top} "
                  f"(FMUL {n(i0, back, 'FMUL') + n(top, arrive, 'FMUL')}, EX2 {n(i0, back, 'MUFU.EX2')})")


if __name__ == "__main__":
    {"assemble": assemble, "assemble_backward": assemble_backward, "assemble_variants": assemble_variants,
     "assemble_masks": assemble_masks, "count": count, "loops": loops,
     "waits": waits}[sys.argv[1]](sys.argv[2])  # fmt: skip
