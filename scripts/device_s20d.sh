#!/usr/bin/env bash
# Session 20, call 4: the wgmma forward's dynamic tile scheduler (NUMBA_FLASH_WGMMA_SCHEDULER
# =dynamic: persistent blocks take their tiles from a counter): the forward's GPU suite and
# racecheck with it on; the varlen diagnosis (scripts/ncu_varlen.py) static / dynamic; the
# issue's forward table (bench_table.py --forward-only --queued --tc-only --no-peer) static /
# dynamic; d = 192 and 256 persistent with the dynamic scheduler against a block a tile.
set -u
out=$1
. scripts/device_ab.sh
NUMBA_FLASH_WGMMA_SCHEDULER=dynamic timeout 130 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu \
  tests/test_wgmma_forward.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
NUMBA_FLASH_WGMMA_SCHEDULER=dynamic sanitize racecheck wgmma 70
for s in static dynamic; do
  NUMBA_FLASH_WGMMA_SCHEDULER=$s timeout 50 python3 scripts/ncu_varlen.py "$out/v_$s.jsonl" > "$out/v_$s.txt" 2>&1
  echo "varlen $s rc=$? at ${SECONDS}s" >> "$out/v_$s.txt"
done
for s in static dynamic; do
  NUMBA_FLASH_WGMMA_SCHEDULER=$s side $s 60 t scripts/bench_table.py --forward-only --queued --tc-only --no-peer
done
NUMBA_FLASH_WGMMA_SCHEDULER=dynamic NUMBA_FLASH_WGMMA_PERSISTENT=132 side dyn 50 h scripts/bench_head_dims.py \
  --dims 192,256 --forward-only
python3 scripts/bench_table.py --compare "$out/t_static.jsonl" "$out/t_dynamic.jsonl" > "$out/t_compare.txt" 2>&1
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
grep -E "RACECHECK SUMMARY|rc=|rror" "$out/b_sanitize.txt" | tail -3
for s in static dynamic; do echo "== varlen $s"; tail -8 "$out/v_$s.txt"; done
echo "== table static -> dynamic"; cat "$out/t_compare.txt"; grep "rc=" "$out"/t_*.txt
echo "== d 192/256 dynamic persistent"; tail -6 "$out/h_dyn.txt"
rm -f "$out"/v_*.jsonl "$out"/t_static.txt "$out"/t_dynamic.txt "$out"/h_dyn.jsonl  # (8 files come back)
