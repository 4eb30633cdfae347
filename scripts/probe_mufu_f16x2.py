"""Does a packed 16-bit SFU op halve softcap's SFU work on sm_90a?  (Session 34, offline.)

    python3 scripts/probe_mufu_f16x2.py   # needs ptxas and nvdisasm (or cuobjdump) on PATH

Assembles a small PTX kernel with ``tanh.approx.f16x2``, ``ex2.approx.f16x2`` and
``tanh.approx.f32`` for sm_90a and prints its MUFU instructions.  ptxas 13.0 gives two
``MUFU.TANH.F16`` (and two ``MUFU.EX2.F16``) for each packed op, one a half: the SFU does
the same number of ops as with float32, so packing softcap's tanh arguments to f16x2 would
add the conversions and save nothing on the SFU."""

import os
import subprocess
import sys
import tempfile

PTX = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p){
 .reg .b32 r<4>; .reg .f32 f<4>; .reg .b64 a;
 ld.param.u64 a, [p];
 ld.global.v2.f32 {f1, f2}, [a];
 cvt.rn.f16x2.f32 r1, f2, f1;
 tanh.approx.f16x2 r2, r1;
 st.global.b32 [a], r2;
 ex2.approx.f16x2 r3, r1;
 st.global.b32 [a+4], r3;
 tanh.approx.f32 f3, f1;
 st.global.f32 [a+8], f3;
 ret;
}
"""


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(PTX)
        subprocess.run(["ptxas", "-arch=sm_90a", ptx, "-o", cubin], check=True)
        sass = subprocess.run(["nvdisasm", "-c", cubin], check=True, capture_output=True, text=True).stdout
    lines = [" ".join(line.split()[1:]).rstrip(" ;") for line in sass.splitlines() if "MUFU" in line or "F2FP" in line]
    print("\n".join(lines))
    tanh16 = sum("MUFU.TANH.F16" in x for x in lines)
    print(f"tanh.approx.f16x2 -> {tanh16} MUFU.TANH.F16 (one a half)" if tanh16 == 2 else f"{tanh16} MUFU.TANH.F16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
