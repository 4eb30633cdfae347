#!/usr/bin/env bash
# Backward tile sweep of the tensor-core kernels at one head dim, one process a config
# (NUMBA_FLASH_TILES, config.tuning_override), fp16, non-causal, N = 4096, against
# SDPA flash in the same process (scripts/bench_head_dims.py --backward-only --full-only).
#   scripts/sweep_tc_bwd.sh OUT.jsonl D '[4, 32, 32, false]' '[4, 64, 64, false]' ...
# Fields after head_dim: warps, kv_block_m, q_block_n, kv_frags_in_regs[, q_frags_in_regs, split_dkdv].
out=$1; d=$2; shift 2
for cfg in "$@"; do
  NUMBA_FLASH_TILES="{\"tc_backward\": {\"$d\": $cfg}}" timeout 40 \
    python3 scripts/bench_head_dims.py /tmp/sweep_one.jsonl --dims "$d" --backward-only --full-only | grep '^{' >> "$out"
done
