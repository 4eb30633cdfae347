"""Is a refactor's PTX the same? Compile a matrix of default configurations (fp16 / bf16,
sm_90a, forward and backward, plain and each variant) offline and write their PTX to a folder,
or compare two such folders with numba's mangled environment globals, addresses and line
records left out. No GPU needed (``numba.cuda.compile_ptx``, ``inspection.inspect_kernels``).

    PYTHONPATH=old_tree python3 scripts/ptx_diff.py dump /tmp/ptx/base
    PYTHONPATH=new_tree python3 scripts/ptx_diff.py dump /tmp/ptx/new
    python3 scripts/ptx_diff.py compare /tmp/ptx/base /tmp/ptx/new [--anonymous]

Session 37 removed seven opt-in switches from the Hopper kernels with this: all 25 kernels of
the matrix (its first 16 configurations) compared equal (``compare`` prints each kernel's count
of differing lines and exits 1 when one differs or is missing).  Session 38's removal of the
ordered dQ took ``--anonymous`` (register numbers blanked: :func:`normalised`), since a dead
read gone from the backward renumbered every register after it.
"""

import difflib
import os
import re
import sys

#: (pass, dtype, head dim, causal, variants[, query rows]): the kernels the plan picks on sm_90a for each
#: (``inspection.SEQLEN_Q`` rows unless given: 1024 rows at d = 64 causal take the persistent dK/dV kernel
#: and the two-consumer forward).
MATRIX = [
    ("forward", "float16", 128, True, {}), ("forward", "float16", 128, False, {}),
    ("forward", "float16", 64, True, {}), ("forward", "float16", 256, True, {}),
    ("forward", "float16", 96, False, {}), ("forward", "bfloat16", 128, True, {"softcap": True}),
    ("forward", "float16", 64, True, {"softcap": True}),
    ("forward", "float16", 128, True, {"alibi": True}), ("forward", "float16", 128, True, {"dropout": True}),
    ("forward", "float16", 128, True, {"window_left": True}), ("forward", "float16", 128, True, {"varlen": True}),
    ("forward", "float16", 128, True, {"gqa": True, "softcap": True, "alibi": True, "dropout": True,
                                       "window_left": True, "varlen": True}),
    ("backward", "float16", 128, True, {}), ("backward", "float16", 64, False, {}),
    ("backward", "float16", 128, True, {"softcap": True, "dropout": True}),
    ("backward", "bfloat16", 256, True, {"varlen": True, "window_left": True}),
    ("forward", "float16", 64, True, {}, 1024), ("backward", "float16", 64, True, {}, 1024),
]  # fmt: skip


def dump(folder):
    from numba_flash.inspection import inspect_kernels

    os.makedirs(folder, exist_ok=True)
    for i, (pass_, dtype, d, causal, variants, *rows) in enumerate(MATRIX):
        kw = {"seqlen_q": rows[0]} if rows else {}
        for r in inspect_kernels(pass_, dtype, d, causal, arch="sm_90a", variants=variants, **kw):
            name = f"{i:02d}_{pass_}_{dtype}_{d}_{int(causal)}_{'-'.join(sorted(variants)) or 'plain'}_{r.name}"
            with open(os.path.join(folder, name + ".ptx"), "w") as f:
                f.write(r.ptx)
            print(name, flush=True)


def normalised(path, anonymous=False):
    """The PTX's lines without numba's environment globals (their mangled names carry
    function addresses and numbering), ``.loc`` / ``.file`` records (line numbers), with
    addresses, numba's ``B<n>v<n>B`` ABI tags and its shared arrays' numbering
    (``_cudapy_smem_<n>``) in names blanked.  ``anonymous``: the registers' numbers blanked
    too and their ``.reg`` declarations left out, so that one instruction gone (a dead read
    of ``%dynamic_smem_size``) does not renumber every line after it: the instructions,
    operands' kinds and immediates are compared, not the data flow."""
    out = []
    with open(path) as f:
        for line in f:
            if "NumbaEnv" in line or re.match(r"\s*\.(loc|file)\b", line):
                continue
            if anonymous and re.match(r"\s*\.reg\b", line):
                continue
            line = re.sub(r"_cudapy_smem_\d+", "_cudapy_smem_N", line)
            line = re.sub(r"B\d+v\d+B", "BvB", re.sub(r"0x7f[0-9a-f]+", "ADDR", line))
            if anonymous:
                line = re.sub(r"%(rd|rs|r|fd|f|p|hh|h)\d+\b", r"%\1", line)
            out.append(line)
    return out


def compare(a, b, anonymous=False):
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    bad = 0
    for name in names:
        if not (os.path.exists(os.path.join(a, name)) and os.path.exists(os.path.join(b, name))):
            print(f"missing on one side: {name}")
            bad += 1
            continue
        diff = [x for x in difflib.unified_diff(normalised(os.path.join(a, name), anonymous),
                                                 normalised(os.path.join(b, name), anonymous), n=0)
                if x[:1] in "+-" and x[:3] not in ("+++", "---")]  # fmt: skip
        print(f"{len(diff):6d} {name}")
        bad += bool(diff)
    print(f"{len(names) - bad} of {len(names)} kernels the same")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"] and len(sys.argv) == 3:
        dump(sys.argv[2])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) in (4, 5) and sys.argv[4:] in ([], ["--anonymous"]):
        sys.exit(compare(sys.argv[2], sys.argv[3], sys.argv[4:] == ["--anonymous"]))
    else:
        sys.exit(__doc__)
