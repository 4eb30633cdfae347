#!/usr/bin/env bash
# Session 20, call 5: with the dynamic scheduler on by default: the replay's GPU test (a
# recorded call's fresh counter), the KV cache's prefills on the Hopper forward, the
# varlen GPU tests; issue #11's window and varlen rows (bench_variants.py --queued
# --short-walks).
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_replay.py tests/test_kvcache.py \
  tests/test_wgmma_forward.py -k "replay or prefill or varlen or persistent" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 100 e scripts/bench_variants.py --queued --short-walks
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
echo "== short walks"; tail -11 "$out/e_new.txt"
