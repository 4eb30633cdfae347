#!/usr/bin/env bash
# Session 22, call 3: the in-kernel split-KV merge in one pass (tmp_new) against the two-pass
# one of call 2 (tmp_old = 78af7f3): GPU tests of the KV cache and the
# merge; issue #14's decode table at 4096 and 32768 keys (split sweep at 4096), old / new /
# old / new in turn; the 4096-key step under Nsight Compute (new).
set -u
out=$1
. scripts/device_ab.sh
timeout 120 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu -n 4 tests/test_kvcache.py \
  tests/test_merge.py > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
for run in old new; do side $run 70 c scripts/bench_decode.py --decode-only --lengths 4096,32768 --sweep-at 4096; done
for run in old new; do side $run 70 e scripts/bench_decode.py --decode-only --lengths 4096 --sweep-at 4096; done
timeout 70 ncu --clock-control none --section LaunchStats --section SpeedOfLight \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum python3 scripts/ncu_decode.py 4096 > "$out/d_ncu.txt" 2>&1
echo "ncu rc=$? at ${SECONDS}s" >> "$out/d_ncu.txt"
grep -E "ncu_decode:|gpu__time_duration.sum|rc=" "$out/d_ncu.txt" | grep -v "^==" | tail -16
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -8
for f in c_old c_new e_old e_new; do echo "== $f"; grep -v -i warn "$out/$f.txt" | grep -E "decode|rc=" | tail -10; done
