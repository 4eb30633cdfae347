"""``numba-flash inspect``: compile the kernels a pass would launch and summarise them.

:func:`inspect_kernels` takes the launch plan (``numba_flash.plan``) of a problem for
the requested architecture and compiles each kernel's Python function, for the argument
types its roles give, with ``numba.cuda.compile_ptx`` — no GPU needed.  That needs the real ``numba.cuda``: when the
CUDA simulator is on in this process the compilation runs in a subprocess
(``python -m numba_flash.inspection``) with ``NUMBA_ENABLE_CUDASIM`` removed from its
environment.

Per kernel it reports:

* instruction counts read off the PTX (static counts: instructions in the code, not
  executions): ``mma`` (mma.sync / wgmma), ``ldmatrix``, ``cp.async``, loads and stores
  by state space (``ld.shared``, ``st.shared``, ``ld.global``, ``st.global``,
  ``ld.local``, ``st.local``, ``ld.param``, and ``ld.generic`` / ``st.generic`` for the
  generic-address ``ld.``/``st.`` numba emits for array accesses, which are global
  memory in these kernels), ``ex2``, ``shfl``, ``bar.sync``, ``fma``, ``atom`` (atom/red)
  and the total;
* static shared memory and local memory from the PTX declarations (``.shared`` /
  ``.local`` arrays);
* registers, spill stores / loads, stack frame, shared and local memory from the
  assembler, when one is available: nvJitLink (``cuda.bindings.nvjitlink``, the one
  matching numba-cuda's NVVM) first, then a ``ptxas`` (the nvidia-cuda-nvcc wheel,
  ``$CUDA_HOME/bin``, the PATH) with ``-v``; otherwise "n/a (no ptxas)".
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field

NA = "n/a"
#: Query rows a sequence the inspected kernels are planned for (the tiles depend on it
#: only at or below ``config.DECODE_ROWS``: the forward's decode tiles).
SEQLEN_Q = 4096
COUNT_KEYS = (
    "mma", "ldmatrix", "cp.async", "ld.shared", "st.shared", "ld.global", "st.global",
    "ld.generic", "st.generic", "ld.local", "st.local", "ld.param", "ex2", "shfl",
    "bar.sync", "fma", "atom", "total",
)  # fmt: skip
_SPACES = ("shared", "global", "local", "param", "const")
_ELEM_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
               "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}  # fmt: skip
_DECL = re.compile(r"^\s*(?:\.visible\s+|\.extern\s+|\.weak\s+)*\.(shared|local)\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+\s*\[(\d*)\]")


@dataclass
class KernelReport:
    """What one compiled kernel looks like."""

    name: str
    family: str
    arch: str
    tiles: dict
    counts: dict
    shared_bytes_ptx: int
    local_bytes_ptx: int
    dynamic_shared: bool = False
    dynamic_shared_bytes: int | None = None  # what the API asks for at launch (the plan)
    note: str = ""  # why a faster family does not apply here (the plan's note)
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack_bytes: int | None = None
    shared_bytes: int | None = None
    local_bytes: int | None = None
    assembler: str = NA  # what gave registers/spills, or why nothing did
    ptx: str = field(default="", repr=False)

    def to_dict(self, with_ptx: bool = False) -> dict:
        d = asdict(self)
        if not with_ptx:
            d.pop("ptx")
        return d


def arch_name(arch: str) -> str:
    """The canonical name of ``arch`` (:func:`parse_arch`'s spellings): ``"sm_XY"``, or
    ``"sm_XYa"`` for the arch-specific target (wgmma and setmaxnreg need ``sm_90a``)."""
    major, minor = parse_arch(arch)
    return f"sm_{major}{minor}{'a' if str(arch).strip().lower().endswith('a') else ''}"


def parse_arch(arch: str) -> tuple[int, int]:
    """``"sm_90"`` → (9, 0); ``"sm_120"`` → (12, 0); also accepts "90", "9.0", "compute_90"."""
    s = str(arch).strip().lower()
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)\.(\d)", s) or re.fullmatch(r"(?:sm_|compute_)?(\d+)(\d)a?", s)
    if not m:
        raise ValueError(f"arch {arch!r}: expected sm_XY, e.g. sm_90 or sm_80")
    major, minor = int(m.group(1)), int(m.group(2))
    if major < 5:
        raise ValueError(f"arch {arch!r}: numba-cuda targets sm_50 and newer")
    return major, minor


def _instructions(ptx: str):
    """The opcode of every instruction line (predicates and labels stripped)."""
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".", "{", "}", ")", "(")) or s.endswith(":"):
            continue
        if s.startswith("@"):
            parts = s.split(None, 1)
            if len(parts) < 2:
                continue
            s = parts[1]
        op = s.split(None, 1)[0].rstrip(";")
        if not op or not op[0].isalpha():
            continue
        yield op


def count_instructions(ptx: str) -> dict:
    """Static counts of the instruction classes in ``COUNT_KEYS``."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    for op in _instructions(ptx):
        counts["total"] += 1
        parts = op.split(".")
        head = parts[0]
        if head in ("mma", "wgmma"):
            counts["mma"] += 1
        elif head == "ldmatrix":
            counts["ldmatrix"] += 1
        elif head == "cp" and len(parts) > 1 and parts[1] == "async":
            counts["cp.async"] += 1
        elif head in ("ld", "ldu", "st"):
            kind = "st" if head == "st" else "ld"
            space = next((p.split("::")[0] for p in parts[1:] if p.split("::")[0] in _SPACES), "generic")
            key = f"{kind}.{space}"
            if key in counts:
                counts[key] += 1
        elif head == "ex2":
            counts["ex2"] += 1
        elif head == "shfl":
            counts["shfl"] += 1
        elif head in ("bar", "barrier") and len(parts) > 1 and parts[1] == "sync":
            counts["bar.sync"] += 1
        elif head == "fma":
            counts["fma"] += 1
        elif head in ("atom", "red"):
            counts["atom"] += 1
    return counts


def declared_memory(ptx: str) -> tuple[int, int, bool]:
    """(static shared bytes, local bytes, has dynamic shared) from the PTX declarations."""
    shared = local = 0
    dynamic = False
    for line in ptx.splitlines():
        m = _DECL.match(line)
        if not m:
            continue
        space, ty, n = m.groups()
        if n == "":
            dynamic = dynamic or space == "shared"
            continue
        size = int(n) * _ELEM_BYTES.get(ty, 1)
        if space == "shared":
            shared += size
        else:
            local += size
    return shared, local, dynamic


# --------------------------------------------------------------------------------------
# Registers and spills: nvJitLink or ptxas
# --------------------------------------------------------------------------------------

_RES = {
    "registers": re.compile(r"[Uu]sed (\d+) registers"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame|(\d+) stack\b"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "local_bytes": re.compile(r"(\d+) bytes lmem"),
}


def parse_resource_log(log: str) -> dict:
    """Registers, spills, stack, smem, lmem from ptxas -v / nvJitLink -verbose output
    (the first kernel's values; None where absent)."""
    out = {}
    for key, rx in _RES.items():
        m = rx.search(log)
        out[key] = None if m is None else int(next(g for g in m.groups() if g is not None))
    return out


def _nvjitlink_resources(ptx: str, arch: str) -> tuple[dict | None, str]:
    try:
        from cuda.bindings import nvjitlink
    except Exception:
        return None, "no nvJitLink (cuda-bindings)"
    try:
        ver = ".".join(str(x) for x in nvjitlink.version())
        h = nvjitlink.create(2, [f"-arch={arch}", "-verbose"])
        try:
            data = ptx.encode()
            nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
            nvjitlink.complete(h)
            size = nvjitlink.get_info_log_size(h)
            buf = bytearray(size)
            nvjitlink.get_info_log(h, buf)
            log = bytes(buf).rstrip(b"\0").decode(errors="replace")
        finally:
            nvjitlink.destroy(h)
    except Exception as exc:
        return None, f"nvJitLink failed: {type(exc).__name__}: {str(exc)[:120]}"
    res = parse_resource_log(log)
    if res["registers"] is None:
        return None, "nvJitLink printed no resource usage"
    return res, f"nvJitLink {ver}"


def ptxas_candidates() -> list[str]:
    """ptxas executables to try: the nvidia-cuda-nvcc wheels, $CUDA_HOME, the PATH."""
    found = []
    roots = []
    for p in sys.path:
        if p and os.path.isdir(os.path.join(p, "nvidia")):
            roots.append(os.path.join(p, "nvidia"))
    for root in roots:
        for pat in ("cuda_nvcc/bin/ptxas", "cu1*/bin/ptxas", "*/bin/ptxas"):
            found.extend(sorted(glob.glob(os.path.join(root, pat))))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            found.append(os.path.join(os.environ[env], "bin", "ptxas"))
    w = shutil.which("ptxas")
    if w:
        found.append(w)
    found.append("/usr/local/cuda/bin/ptxas")
    seen, out = set(), []
    for f in found:
        r = os.path.realpath(f)
        if r not in seen and os.path.isfile(r) and os.access(r, os.X_OK):
            seen.add(r)
            out.append(f)
    return out


@functools.lru_cache(maxsize=None)
def _ptxas_release(exe: str) -> tuple | None:
    """(major, minor) of a ptxas's CUDA release (``ptxas --version``), or None."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except Exception:
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _ptxas_resources(ptx: str, arch: str, lower: bool = False) -> tuple[dict | None, str]:
    """``ptxas -v`` of ``ptx`` as a whole program; ``lower``: its ``.version`` lowered to
    each ptxas's ISA first (``_numba_cuda.driver_ptx``, as the driver's JIT gets it)."""
    from numba_flash._numba_cuda import driver_ptx

    cands = ptxas_candidates()
    if not cands:
        return None, "no ptxas"
    why = []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        for exe in cands:
            release = _ptxas_release(exe) if lower else None
            with open(src, "w") as f:
                f.write(driver_ptx(ptx, release) if release else ptx)
            try:
                p = subprocess.run([exe, f"-arch={arch}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                                   capture_output=True, text=True, timeout=120)  # fmt: skip
            except Exception as exc:
                why.append(f"{exe}: {type(exc).__name__}")
                continue
            log = p.stdout + p.stderr
            if p.returncode == 0:
                res = parse_resource_log(log)
                if res["registers"] is not None:
                    return res, f"ptxas ({exe})"
            first = next((ln.strip() for ln in log.splitlines() if "fatal" in ln or "error" in ln), log.strip()[:100])
            why.append(f"{exe}: {first[:140]}")
    return None, "ptxas failed: " + "; ".join(why)


def resources(ptx: str, arch: str, whole_program: bool = False) -> tuple[dict | None, str]:
    """Registers/spills for ``ptx``: (dict or None, which tool, or why none).  A
    ``whole_program`` kernel (``_numba_cuda.whole_program_dispatcher``: on the GPU the
    driver's JIT assembles it whole, honouring ``setmaxnreg``) goes to a ptxas first, as
    one whole program; nvJitLink assembles a relocatable unit, whose registers and
    spills are not the GPU's (the report says so)."""
    if whole_program:
        res, how = _ptxas_resources(ptx, arch, lower=True)
        if res is not None:
            return res, how + ", whole program (as the driver's JIT on the GPU)"
        res2, how2 = _nvjitlink_resources(ptx, arch)
        if res2 is not None:
            return res2, how2 + " (relocatable: ignores setmaxnreg; the GPU assembles it whole)"
        return None, f"n/a ({how}; {how2})"
    res, how = _nvjitlink_resources(ptx, arch)
    if res is not None:
        return res, how
    res2, how2 = _ptxas_resources(ptx, arch)
    if res2 is not None:
        return res2, how2
    if how2 == "no ptxas":
        return None, f"n/a (no ptxas; {how})"
    return None, f"n/a ({how}; {how2})"


# --------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------


def _simulator_on() -> bool:
    if "numba" in sys.modules:
        from numba import config

        return bool(config.ENABLE_CUDASIM)
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def argtypes(launch, work_dtype: str) -> tuple:
    """The numba types a launch's arguments have at run time (4-D arrays of any
    layout, lse/delta C-contiguous float32, the scale a float64, the variants' params
    tuple, ALiBi slopes, varlen offsets and a plain call's flex tuple)."""
    import numpy as np

    from numba_flash.variant import PARAM_KINDS
    from numba import types
    from numba.np import numpy_support

    elem = {"u16": types.uint16, "u32": types.uint32, "f32": types.float32}
    out = []
    for a in launch.args:
        if a.role == "scale":
            out.append(types.float64)
        elif a.role == "params":
            out.append(types.Tuple([types.int64 if k == "int" else types.float64 for k in PARAM_KINDS]))
        elif a.role == "alibi":
            out.append(types.Array(types.float32, 2, "C"))
        elif a.role in ("cu_seqlens_q", "cu_seqlens_k", "sched", "sched0"):
            out.append(types.Array(types.int32, 1, "C"))
        elif a.role == "flex":  # a plain call's (``api.plain_fx``): no mod_args, dummy lists, table and split
            lists = (types.Array(types.int32, 3, "C"), types.Array(types.int32, 4, "C"))
            out.append(types.Tuple((types.Tuple(()), types.Tuple(())) + lists + lists +
                                   (types.Array(types.int32, 1, "C"), types.Array(types.int32, 2, "C"),
                                    types.Array(types.int32, 1, "C"), types.Array(types.uint32, 4, "C"),
                                    types.Array(types.float32, 3, "C"), types.Array(types.int32, 1, "C"))))  # fmt: skip
        elif a.role == "tmaps":
            out.append(types.Array(types.uint8, 2, "C"))
        elif a.role in ("lse", "delta"):
            out.append(types.Array(types.float32, 3, "C"))
        elif a.role == "stats":
            out.append(types.Array(types.float32, 4, "C"))
        else:
            ty = elem.get(a.view) or numpy_support.from_dtype(np.dtype(work_dtype))
            out.append(types.Array(ty, 4, "A"))
    return tuple(out)


def _compile_here(pass_: str, dtype: str, head_dim: int, causal: bool, arch: str, tf32: bool = False,
                  variants: dict | None = None, seqlen_q: int = SEQLEN_Q) -> list[KernelReport]:
    from numba import cuda

    from numba_flash import plan as P
    from numba_flash._numba_cuda import compiling_for

    cc = parse_arch(arch)
    label = arch_name(arch)  # "sm_90a": the arch-specific target, as numba-cuda picks on an sm_90 device
    target = cc + ("a",) if label.endswith("a") else cc
    from numba_flash.variant import Variant

    features = Variant(**(variants or {}))
    pl = P.plan(P.Problem(pass_, dtype, head_dim, causal, allow_tf32=tf32, arch=target, features=features,
                          seqlen_q=seqlen_q, seqlen_k=max(seqlen_q, SEQLEN_Q)))  # fmt: skip
    reports = []
    for launch in pl.launches:
        with compiling_for(cc):  # the kernels' device functions too, without a GPU
            bounds = getattr(launch.kernel, "targetoptions", {}).get("launch_bounds")  # as the GPU build has them
            ptx, _ = cuda.compile_ptx(launch.kernel.py_func, argtypes(launch, pl.work_dtype), cc=target,
                                      launch_bounds=bounds)  # fmt: skip
        shared, local, dynamic = declared_memory(ptx)
        rep = KernelReport(
            name=launch.name,
            family=pl.family,
            arch=label,
            tiles=asdict(launch.tiles),
            counts=count_instructions(ptx),
            shared_bytes_ptx=shared,
            local_bytes_ptx=local,
            dynamic_shared=dynamic,
            dynamic_shared_bytes=launch.smem if dynamic else None,
            note=pl.note,
            ptx=ptx,
        )
        res, how = resources(ptx, label, getattr(launch.kernel, "_numba_flash_whole_program", False))
        rep.assembler = how
        if res is not None:
            for key, value in res.items():
                setattr(rep, key, value)
        reports.append(rep)
    return reports


def _compile_in_subprocess(pass_, dtype, head_dim, causal, arch, tf32=False, variants=None,
                           seqlen_q=SEQLEN_Q) -> list[KernelReport]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    # the package must be importable from the child as it is here
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    args = json.dumps(dict(pass_=pass_, dtype=dtype, head_dim=head_dim, causal=causal, arch=arch, tf32=tf32,
                           variants=variants, seqlen_q=seqlen_q))  # fmt: skip
    p = subprocess.run(
        [sys.executable, "-m", "numba_flash.inspection", args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
        raise RuntimeError("compiling in a subprocess (the simulator is on here) failed:\n" + "\n".join(tail))
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    if "error" in doc:
        raise (ValueError if doc.get("usage") else RuntimeError)(doc["error"])
    return [KernelReport(**d) for d in doc["kernels"]]


def inspect_kernels(pass_: str, dtype: str, head_dim: int, causal: bool, arch: str = "sm_90",
                    tf32: bool = False, variants: dict | None = None, seqlen_q: int = SEQLEN_Q) -> list[KernelReport]:
    """Compile every kernel ``pass_`` would launch for (dtype, head_dim, causal) for
    ``arch`` and summarise it (``tf32``: as ``flash_attention(..., allow_tf32=True)``;
    ``variants``: ``numba_flash.variant.Variant``'s fields other than causal, e.g.
    ``{"softcap": True, "gqa": True}``; ``seqlen_q``: query rows a sequence, default
    ``SEQLEN_Q``: at most ``config.DECODE_ROWS`` gives the forward's decode tiles).
    Works without a GPU and with the simulator on."""
    if not isinstance(seqlen_q, int) or seqlen_q < 1:
        raise ValueError(f"seqlen_q={seqlen_q!r}: expected an int >= 1")
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass: expected 'forward' or 'backward', got {pass_!r}")
    parse_arch(arch)
    if _simulator_on():
        return _compile_in_subprocess(pass_, dtype, head_dim, causal, arch, tf32, variants, seqlen_q)
    return _compile_here(pass_, dtype, head_dim, causal, arch, tf32, variants, seqlen_q)


def _main(argv) -> int:  # the subprocess: JSON in argv[1], one JSON line out
    kw = json.loads(argv[1])
    try:
        reports = _compile_here(**kw)
    except (ValueError, TypeError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "usage": True}))
        return 0
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc), "usage": False}))
        return 0
    print(json.dumps({"kernels": [r.to_dict(with_ptx=True) for r in reports]}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
