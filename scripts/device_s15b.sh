#!/usr/bin/env bash
# Session 15, call 2: dropout's masks drawn under the products, softcap's exponentials partly
# off the SFU (softmax.exp2_fma): bench_variants --dropout-only with the new code and with the
# session's starting code (tmp_old/numba_flash, 467fa6d) on the same machine; the variant
# matrix on every path (dropout, softcap, ALiBi, all, combinations: call 1 ran out of time), the
# wgmma forward's tests of those variants, the new ptx tests, and test_traffic (session 14's
# ratio fix, not re-run on a GPU).
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
timeout 100 python3 scripts/bench_variants.py "$out/a_new.jsonl" --queued --dropout-only > "$out/a_new.txt" 2>&1
echo "new rc=$? at ${SECONDS}s" >> "$out/a_new.txt"
timeout 200 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_variants.py tests/test_wgmma_forward.py \
  tests/test_ptx.py -k "dropout or softcap or alibi or all or combination or float_bits or mul_wide" \
  > "$out/b_pytest_variants.txt" 2>&1
echo "pytest variants rc=$? at ${SECONDS}s" >> "$out/b_pytest_variants.txt"
PYTHONPATH=$PWD/tmp_old:$PYTHONPATH timeout 100 python3 scripts/bench_variants.py "$out/c_old.jsonl" --queued \
  --dropout-only > "$out/c_old.txt" 2>&1
echo "old rc=$? at ${SECONDS}s" >> "$out/c_old.txt"
timeout 110 python3 -m pytest -q -rf -p no:cacheprovider tests/test_traffic.py > "$out/d_traffic.txt" 2>&1
echo "traffic rc=$? at ${SECONDS}s" >> "$out/d_traffic.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/b_pytest_variants.txt" "$out/d_traffic.txt" | tail -20
tail -n 7 "$out/c_old.txt"
tail -n 7 "$out/a_new.txt"
