#!/usr/bin/env bash
# Session 10, call 3: the dropout bar again (softcap/ALiBi/dropout rows), the GPU tests of
# the variants and the dropout bits, memcheck and racecheck of the fp16 kernels with
# dropout (sanitize_small.py float16), then the CLI's decode bench and workspace.
set -u
out=$1
. scripts/device_cli.sh
timeout 80 python3 scripts/bench_variants.py "$out/a_variants.jsonl" --queued --dropout-only > "$out/a_variants.txt" 2>&1
tail -5 "$out/a_variants.txt"
timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider tests/test_variants.py tests/test_dropout_bits.py \
  tests/test_flex_kernels.py -k "dropout or all" > "$out/b_pytest.txt" 2>&1; echo "pytest rc=$?" >> "$out/b_pytest.txt"
tail -3 "$out/b_pytest.txt"
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 scripts/sanitize_small.py float16 > /tmp/san_$tool.txt 2>&1
  echo "$tool rc=$?" >> /tmp/san_$tool.txt
done
cat /tmp/san_memcheck.txt /tmp/san_racecheck.txt > "$out/c_sanitizers.txt"; grep -hE "SUMMARY|rc=" "$out/c_sanitizers.txt"
{ timeout 90 numba-flash bench --decode --seqlen 4096,32768,131072 --json /tmp/bd.json; echo "rc=$?";
  timeout 50 numba-flash memory --decode --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --min-seqlen 4096 --max-seqlen 131072 --no-progress; echo "rc=$?"; } \
  > "$out/d_cli_decode.txt" 2>&1
tail -40 "$out/d_cli_decode.txt"
