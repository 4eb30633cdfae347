#!/usr/bin/env bash
# Session 27: dropout's keep bits from the producer warpgroup's warps 1–3 (wgmma_forward.keep_bits,
# on by default; NUMBA_FLASH_KEEP_BITS=0 gives each consumer its own Philox calls as before).
# The Hopper forward's GPU tests and the variant matrix's dropout cases, the A/B in one process on
# issue #13's shapes with dropout (bench_ab.py --dropout), issue #11's dropout rows
# (bench_variants.py --dropout-only), racecheck and synccheck of the Hopper forward's small cases.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 170 python3 -m pytest -v -rf -n 8 -m gpu -p no:cacheprovider tests/test_wgmma_forward.py \
  "tests/test_variants.py::test_variant_gpu_matrix" -k "wgmma or dropout" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 210 b scripts/bench_ab.py NUMBA_FLASH_KEEP_BITS=0,1 --dropout
variants new
sanitize racecheck wgmma 60
sanitize synccheck wgmma 40
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|finite: False|Error" "$out/b_sanitize.txt" | tail -8
tail -n 4 "$out/c_new.txt"
tail -n 13 "$out/b_new.txt"
