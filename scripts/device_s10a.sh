#!/usr/bin/env bash
# Session 10, call 1: the GPU tests written in session 9 and not yet run (Hopper
# intrinsics, the decode workspace), the KV-cache suite with the 32 x 3 decode tiles,
# `bench --decode`, `memory --decode`, a split sweep at 4096 keys, issue #11's variant
# bars and the d = 96 / 256 backward.  Logs under $1.
set -u
out=$1
timeout 240 python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider tests/test_ptx_hopper.py tests/test_bench_decode.py \
  tests/test_kvcache.py tests/test_merge.py > "$out/a_pytest.txt" 2>&1; echo "pytest rc=$?" >> "$out/a_pytest.txt"
tail -3 "$out/a_pytest.txt"
{ timeout 120 numba-flash bench --decode --seqlen 4096,32768,131072 --json /tmp/bd.json; echo "rc=$?";
  timeout 60 numba-flash memory --decode --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --min-seqlen 4096; echo "rc=$?"; } \
  > "$out/b_cli_decode.txt" 2>&1
tail -30 "$out/b_cli_decode.txt"
timeout 120 python3 scripts/bench_decode.py /tmp/sw.jsonl --lengths 4096 --sweep-at 4096 --decode-only > "$out/c_sweep4096.txt" 2>&1
tail -9 "$out/c_sweep4096.txt"
timeout 150 python3 scripts/bench_variants.py "$out/d_variants.jsonl" --queued > "$out/d_variants.txt" 2>&1
tail -25 "$out/d_variants.txt"
timeout 90 python3 scripts/bench_head_dims.py /tmp/hd.jsonl --dims 96,256 --backward-only --full-only > "$out/e_headdims.txt" 2>&1
tail -6 "$out/e_headdims.txt"
