#!/usr/bin/env bash
# Prepared in session 28 (no device time was left to run it): the two opt-in switches of the Hopper
# forward written that session, each A/B in one process (bench_ab.py: the values in turn, five
# rounds), and their GPU tests.
# Expected (written before any timing):
#  * FlashAttention-4's lazy rescaling (NUMBA_FLASH_LAZY_RESCALE=8): the forward +2-5% at d = 128 (64
#    FMUL a thread a tile skipped, between a P·V's completion and the next P·V's issue; 699 -> ~648
#    instructions a tile executed), +1-2% at d = 64 (32 FMUL);
#  * softcap's Q prescaled by scale / cap (NUMBA_FLASH_SOFTCAP_PRESCALE=1): softcap's forward +4-8% at
#    d = 128 (the key loop 911 -> 847 instructions causal, 826 -> 762 not), a little less at d = 64
#    (849 -> 787, one spilled word).
set -u
out=$1
. scripts/device_ab.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
timeout 90 python3 -m pytest -v -rf -n 4 -p no:cacheprovider tests/test_wgmma_forward.py -k "lazy or prescaled" \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
side new 200 l scripts/bench_ab.py NUMBA_FLASH_LAZY_RESCALE=0,8
side new 200 p scripts/bench_ab.py NUMBA_FLASH_SOFTCAP_PRESCALE=0,1 --softcap
grep -E "FAILED|passed|failed|rc=" "$out/a_pytest.txt" | tail -8
tail -n 14 "$out/l_new.txt"
tail -n 14 "$out/p_new.txt"
