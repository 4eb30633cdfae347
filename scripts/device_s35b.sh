#!/usr/bin/env bash
# Session 35, call 2 (H200): what the profile says about issue #11's missed bars
# (scripts/ncu_bars.py under ncu: plain / softcap / ALiBi / dropout forward, causal and window
# forward + backward, padded and varlen forward + backward, one call each after a warm-up),
# then pytest -m gpu of the Hopper forward and backward (their code last ran on a GPU in
# session 34, 10 tests) and of the torch / JAX arrays (bf16 included), then memcheck of the
# Hopper varlen passes with what is left.
# Expected (written before the run): softcap and dropout forwards issue-bound (issue slots
# > 60%, the tensor pipe below plain's), the window's tensor pipe near causal's with a
# shorter kernel, the varlen backward's dK/dV kernel below the padded one's tensor pipe.
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
timeout 220 ncu --clock-control none --profile-from-start off --csv --page raw --log-file "$out/n_bars.csv" \
  --metrics "$(python3 scripts/ncu_bars.py --metrics)" python3 scripts/ncu_bars.py > "$out/n_bars.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/n_bars.txt"
python3 scripts/ncu_bars.py --table "$out/n_bars.csv" > "$out/n_table.md" 2>&1
timeout $(( 430 - SECONDS )) python3 -m pytest -m gpu -q -n 16 -p no:cacheprovider tests/test_wgmma_forward.py \
  tests/test_wgmma_backward.py tests/test_arrays.py > "$out/p_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/p_pytest.txt"
[ "$SECONDS" -lt 440 ] && sanitize memcheck wgmma_varlen $(( 480 - SECONDS ))
tail -n 4 "$out/n_bars.txt"
cat "$out/n_table.md"
tail -n 3 "$out/p_pytest.txt"; grep -E "^FAILED|^ERROR" "$out/p_pytest.txt" | head
grep -hE "SUMMARY|rc=" "$out/b_sanitize.txt" 2>/dev/null
exit 0
