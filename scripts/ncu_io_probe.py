"""Issue #16's measurement, many sizes in one process, for Nsight Compute.

    ncu --clock-control none --profile-from-start off --csv --print-units base \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,... \
        python3 scripts/ncu_io_probe.py [--standard-max N] > ncu.csv
    python3 scripts/ncu_io_probe.py --parse ncu.csv out.jsonl
    python3 scripts/ncu_io_probe.py --plot out.jsonl io_d{d}.png      # one plot per head dim

For every (head dim, N, pass) the profiled range holds one empty marker kernel named
``io_marker_<i>`` (CuPy RawKernel), then numba-flash's kernels for the case, then (up to
``--standard-max``) the CuPy standard attention's.  ``--parse`` sums the metrics per case
and per implementation and prints them beside ``numba_flash.traffic``'s model.
"""

import json
import sys

CASES = [(d, n, p, False) for d in (64, 128) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536)
         for p in ("forward", "backward")] + [(128, 16384, p, True) for p in ("forward", "backward")]
B, H = 1, 16


def run(standard_max):
    import cupy as cp
    import numpy as np

    import numba_flash
    from numba_flash.bench.peers import cupy_attention_backward, cupy_attention_forward

    rng = np.random.default_rng(0)
    for i, (d, n, pass_, causal) in enumerate(CASES):
        marker = cp.RawKernel(f'extern "C" __global__ void io_marker_{i}() {{}}', f"io_marker_{i}")
        q, k, v, do = (cp.asarray(rng.standard_normal((B, n, H, d), np.float32)).astype(cp.float16) for _ in range(4))
        out, lse = numba_flash.flash_attention(q, k, v, causal=causal, return_lse=True)
        std = n <= standard_max and not causal
        qh, kh, vh, doh = (x.transpose(0, 2, 1, 3) for x in (q, k, v, do))

        if pass_ == "backward" and std:
            s_out, p = cupy_attention_forward(qh, kh, vh)
        numba_flash.flash_attention(q, k, v, causal=causal) if pass_ == "forward" else \
            numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=causal)
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.profiler.start()
        marker((1,), (1,), ())
        if pass_ == "forward":
            numba_flash.flash_attention(q, k, v, causal=causal)
            if std:
                cupy_attention_forward(qh, kh, vh)
        else:
            numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=causal)
            if std:
                cupy_attention_backward(doh, qh, kh, vh, s_out, p)
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.profiler.stop()
        print(f"case {i}: d={d} N={n} {pass_} causal={causal} standard={std}", file=sys.stderr, flush=True)
        del q, k, v, do, out, lse, qh, kh, vh, doh
        if pass_ == "backward" and std:
            del s_out, p
        cp.get_default_memory_pool().free_all_blocks()


def parse(csv_path, out_path):
    from numba_flash import traffic
    from numba_flash._report import write_jsonl

    cases, cur = {}, None
    for name, metrics in traffic.ncu_kernels(open(csv_path).read()):
        if name.startswith("io_marker_"):
            cur = int(name.split("_")[-1])
            cases[cur] = []
        elif cur is not None:
            cases[cur].append((name, metrics))
    rows = []
    for i, kernels in cases.items():
        d, n, pass_, causal = CASES[i]
        model = traffic.flash(pass_, "float16", B, H, n, n, d, causal)
        names = [b.name for b in model]
        ours = [(nm, m) for nm, m in kernels if any(x in nm for x in names)]
        theirs = [(nm, m) for nm, m in kernels if (nm, m) not in ours]

        def tot(ks, metric):
            return sum(m.get(metric, 0.0) for _, m in ks)

        dram_model = traffic.dram(pass_, "float16", B, H, n, n, d, causal)
        row = dict(d=d, N=n, pass_=pass_, causal=causal, model_bytes=sum(b.total for b in model),
                   dram_model=sum(b.total for b in dram_model),
                   dram_flash=tot(ours, "dram__bytes_read.sum") + tot(ours, "dram__bytes_write.sum"),
                   dram_flash_read=tot(ours, "dram__bytes_read.sum"),
                   l2_flash=32 * (tot(ours, "lts__t_sectors_srcunit_tex_op_read.sum")
                                  + tot(ours, "lts__t_sectors_srcunit_tex_op_write.sum")),
                   kernels=[dict(name=nm[:60], **m) for nm, m in kernels])
        if theirs:
            row["standard_model"] = sum(b.total for b in traffic.standard(pass_, "float16", B, H, n, n, d, causal))
            row["dram_standard"] = tot(theirs, "dram__bytes_read.sum") + tot(theirs, "dram__bytes_write.sum")
        rows.append(row)
    write_jsonl(rows, out_path)
    print(f"{'d':>4} {'N':>6} {'pass':8} {'c':1} {'tiles GB':>9} {'L2 GB':>8} {'L2/tile':>7} {'DRAM mod':>8} "
          f"{'DRAM GB':>8} {'DRAM/mod':>8} {'std mod':>8} {'std DRAM':>8}")
    for r in rows:
        print(f"{r['d']:4d} {r['N']:6d} {r['pass_']:8} {int(r['causal'])} {r['model_bytes'] / 1e9:9.3f} "
              f"{r['l2_flash'] / 1e9:8.3f} {r['l2_flash'] / r['model_bytes']:7.3f} {r['dram_model'] / 1e9:8.3f} "
              f"{r['dram_flash'] / 1e9:8.3f} {r['dram_flash'] / r['dram_model']:8.3f} "
              f"{r.get('standard_model', 0) / 1e9:8.3f} {r.get('dram_standard', 0) / 1e9:8.3f}")


def plot(jsonl, pattern):
    """``traffic.plot`` of the parsed rows (not causal), one file per head dim."""
    from numba_flash import traffic

    rows = [json.loads(line) for line in open(jsonl)]
    for d in sorted({r["d"] for r in rows}):
        sel = [dict(**{k: v for k, v in traffic.summary(r["pass_"], "float16", B, H, r["N"], d).items()},
                    measured_flash={"read": r["dram_flash_read"], "write": r["dram_flash"] - r["dram_flash_read"]},
                    measured_flash_l2=int(r["l2_flash"]),
                    **({"measured_standard": {"read": r["dram_standard"], "write": 0}} if "dram_standard" in r else {}))
               for r in rows if r["d"] == d and not r["causal"]]  # fmt: skip
        print(traffic.plot(sel, pattern.format(d=d)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--parse"]:
        parse(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["--plot"]:
        plot(sys.argv[2], sys.argv[3])
    else:
        run(int(sys.argv[sys.argv.index("--standard-max") + 1]) if "--standard-max" in sys.argv else 8192)
