#!/usr/bin/env bash
# Prepared in session 29 for its last ~4 minutes of device time (not run: refused starts left less;
# device_s29c.sh cut down): the Hopper backward's variant GPU tests (the dK/dV per-element pass changed), then the d = 64
# backward's variants on the tree before the change (tmp_old) and after (tmp_new).
# Expected (written before the run): d = 64 softcap and dropout backward 5-20% faster; plain equal.
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 70 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_wgmma_backward.py -k variants \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side old 45 d scripts/bench_bwd_variants_ab.py --d64
side new 45 d scripts/bench_bwd_variants_ab.py --d64
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -6
for f in "$out"/d_*.txt; do echo "== $f"; tail -n 3 "$f"; done
