#!/usr/bin/env bash
# Session 20, call 8: after the mend (the replay makes the scheduler's counter only for a
# launch that binds it): the replay's GPU test, the forward's dynamic and persistent GPU
# tests, the KV cache's prefills on the Hopper forward.
set -u
out=$1
. scripts/device_ab.sh
timeout 120 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_replay.py tests/test_kvcache.py \
  tests/test_wgmma_forward.py -k "replay or persistent or prefill_matrix or past_d_128" > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
