#!/usr/bin/env bash
# Session 15, call 1: dropout (Philox4x32-7 in 32-bit words; the wgmma forward drops packed
# P, 1/(1-p) in the epilogue) and softcap (tanh units, the cap in the exponent's FFMA; the
# backward's per-element pass in two copies by needs_mask): SASS mix old against new
# (tmp_sass/, assembled here by `sass_mix.py assemble_variants`, old_* from 467fa6d), the
# GPU tests, and bench_variants --dropout-only (softcap, ALiBi, dropout rows) with the new
# code and with the session's starting code (tmp_old/numba_flash, 467fa6d) in one process each.
set -u
out=$1
. scripts/device_cli.sh
unset NUMBA_FLASH_WGMMA
python3 scripts/sass_mix.py count tmp_sass > "$out/a_sass.txt" 2>&1
echo "sass rc=$? at ${SECONDS}s" >> "$out/a_sass.txt"
timeout 150 python3 scripts/bench_variants.py "$out/b_new.jsonl" --queued --dropout-only > "$out/b_new.txt" 2>&1
echo "new rc=$? at ${SECONDS}s" >> "$out/b_new.txt"
PYTHONPATH=$PWD/tmp_old:$PYTHONPATH timeout 150 python3 scripts/bench_variants.py "$out/c_old.jsonl" --queued \
  --dropout-only > "$out/c_old.txt" 2>&1
echo "old rc=$? at ${SECONDS}s" >> "$out/c_old.txt"
PYTHONPATH=$PWD/tmp_old:$PYTHONPATH python3 -c "import numba_flash; print('old package:', numba_flash.__file__)" >> "$out/c_old.txt" 2>&1
timeout 200 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_dropout_bits.py tests/test_ptx.py \
  tests/test_wgmma_forward.py tests/test_wgmma_backward.py > "$out/d_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/d_pytest.txt"
timeout 120 python3 -m pytest -q -rf -n 8 -p no:cacheprovider tests/test_variants.py \
  -k "dropout or softcap or all or combination" > "$out/e_pytest_variants.txt" 2>&1
echo "pytest variants rc=$? at ${SECONDS}s" >> "$out/e_pytest_variants.txt"
grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$out/d_pytest.txt" "$out/e_pytest_variants.txt" | tail -20
cat "$out/a_sass.txt" | cut -c1-250
tail -n 8 "$out/c_old.txt"
tail -n 8 "$out/b_new.txt"
