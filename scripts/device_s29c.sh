#!/usr/bin/env bash
# Session 29, third device call: the defaults changed after calls 1-2 (softcap's Q prescaled, a
# KV cache's splits on the Hopper forward, two consumers for d = 64 windows) on the GPU: the
# Hopper forward's GPU tests and the KV cache's prefill / split tests, racecheck and synccheck of a
# split prefill, synccheck of the softcap cases (the prescale's named barrier).  (Cut to fit
# the device time left after refused starts: issue #11's variants rows and racecheck of the
# softcap cases are not in it.)
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 150 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_wgmma_forward.py > "$out/a_pytest.txt" 2>&1
echo "pytest wgmma_forward rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 100 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_kvcache.py -k "prefill or split or swap or matrix" \
  >> "$out/a_pytest.txt" 2>&1
echo "pytest kvcache rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize synccheck "wgmma softcap" 60
sanitize racecheck kvsplit 60
sanitize synccheck kvsplit 40
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -12
