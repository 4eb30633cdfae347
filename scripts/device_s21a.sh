#!/usr/bin/env bash
# Session 21, call 1: dropout's keep words drawn by the producer warpgroup's idle warps 1–3
# (wgmma_forward.drop_ahead): the forward's dropout / variant GPU tests (bit for bit against
# reference.dropout_mask), racecheck of the wgmma forward's small cases, the A/B in one
# process (NUMBA_FLASH_DROP_AHEAD=0,1) on the issue's shapes with dropout, and issue #11's
# variant rows (bench_variants.py --queued --dropout-only) with the new code.
# The drop_ahead kernel path ran at commit 928fe2e (call 1) and 5ad4374 (call 2), and was reverted after call 2 (slower).
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -n 4 tests/test_wgmma_forward.py \
  -k "dropout or variants_on_the_gpu or alibi_on_the_tensor" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize racecheck wgmma 110
side new 190 ab scripts/bench_ab.py NUMBA_FLASH_DROP_AHEAD=0,1 --dropout
variants new
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -10
grep -E "RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -4
tail -14 "$out/ab_new.txt"
tail -12 "$out/c_new.txt"
