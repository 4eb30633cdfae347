#!/usr/bin/env bash
# Session 10, call 2: issue #11's variant bars after the 8-bit dropout values, the CLI's
# decode bench and workspace, then the GPU checks (pytest -m gpu, check, sanitizers).
set -u
out=$1
. scripts/device_cli.sh
timeout 150 python3 scripts/bench_variants.py "$out/a_variants.jsonl" --queued > "$out/a_variants.txt" 2>&1
tail -16 "$out/a_variants.txt"
{ timeout 100 numba-flash bench --decode --seqlen 4096,32768,131072 --json /tmp/bd.json; echo "rc=$?";
  timeout 60 numba-flash memory --decode --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --min-seqlen 4096 --max-seqlen 131072; echo "rc=$?"; } \
  > "$out/b_cli_decode.txt" 2>&1
tail -40 "$out/b_cli_decode.txt"
bash scripts/gpu_checks.sh "$out/checks"
