#!/usr/bin/env bash
# Session 29, first device call: the GPU tests of what sessions 27-28 built offline (the masks
# through a lane's frame on the masked paths, the two opt-in Hopper-forward switches, split-KV
# under prefill chunks), synccheck of the Hopper forward, then the switches' A/B (device_s28c.sh's
# bench_ab rows; expectations written there before any timing: lazy rescaling +2-5% forward at
# d = 128, +1-2% at d = 64; softcap's Q prescaled +4-8% softcap forward at d = 128).
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 130 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_variants.py tests/test_wgmma_forward.py \
  -k "window or causal or softcap or all or lazy or prescaled" > "$out/a_pytest.txt" 2>&1
echo "pytest masked rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
timeout 110 python3 -m pytest -v -rf -n 16 -m gpu -p no:cacheprovider tests/test_kvcache.py -k "prefill or matrix" \
  >> "$out/a_pytest.txt" 2>&1
echo "pytest kvcache rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
sanitize synccheck "wgmma" 40
side new 140 l scripts/bench_ab.py NUMBA_FLASH_LAZY_RESCALE=0,8
side new 140 p scripts/bench_ab.py NUMBA_FLASH_SOFTCAP_PRESCALE=0,1 --softcap
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -16
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|Error" "$out/b_sanitize.txt" | tail -6
tail -n 14 "$out/l_new.txt"
tail -n 14 "$out/p_new.txt"
