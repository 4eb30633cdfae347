#!/usr/bin/env bash
# Session 15, call 2: dropout's masks drawn under the products (bench_variants --dropout-only
# again, same machine kind as call 1), the variant matrix on every path (dropout, softcap,
# ALiBi, all, combinations: call 1 ran out of time), the wgmma forward's dropout tests, and
# test_traffic (session 14's ratio fix, not re-run on a GPU).
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 100 python3 scripts/bench_variants.py "$out/a_new.jsonl" --queued --dropout-only > "$out/a_new.txt" 2>&1
echo "new rc=$? at ${SECONDS}s" >> "$out/a_new.txt"
timeout 230 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_variants.py tests/test_wgmma_forward.py \
  -k "dropout or softcap or alibi or all or combination" > "$out/b_pytest_variants.txt" 2>&1
echo "pytest variants rc=$? at ${SECONDS}s" >> "$out/b_pytest_variants.txt"
timeout 150 python3 -m pytest -q -rf -p no:cacheprovider tests/test_traffic.py > "$out/c_traffic.txt" 2>&1
echo "traffic rc=$? at ${SECONDS}s" >> "$out/c_traffic.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/b_pytest_variants.txt" "$out/c_traffic.txt" | tail -20
tail -n 7 "$out/a_new.txt"
