#!/usr/bin/env bash
# Session 20, call 2: the Hopper forward's whole GPU suite (d = 32 … 256, after the wgmma
# forward past d = 128 and the per-variant ping-pong switch); issue #11's softcap / ALiBi /
# dropout rows with the consumers' ping-pong off (the default) and on for softcap and
# dropout only (NUMBA_FLASH_WGMMA_PINGPONG=softcap,dropout: plain stays off, so each
# process's ratios compare against the same plain kernel); d = 192 with persistent blocks
# (132) against a block a tile (the new default past d = 128); the window and varlen rows.
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 -m pytest -v -rf --tb=short -p no:cacheprovider -m gpu tests/test_wgmma_forward.py \
  > "$out/a_pytest.txt" 2>&1
echo "pytest rc=$? at ${SECONDS}s" >> "$out/a_pytest.txt"
variants new
variants pp NUMBA_FLASH_WGMMA_PINGPONG=softcap,dropout
for p in 0 132; do
  NUMBA_FLASH_WGMMA_PERSISTENT=$p side p$p 50 h scripts/bench_head_dims.py --dims 192 --forward-only
done
side new 75 e scripts/bench_variants.py --queued --short-walks
grep -E "FAILED|ERROR|passed|failed|rc=" "$out/a_pytest.txt" | grep -v PASSED | tail -10
for run in new pp; do echo "== variants $run"; tail -6 "$out/c_$run.txt"; done
for p in 0 132; do echo "== d = 192, persistent $p"; tail -3 "$out/h_p$p.txt"; done
echo "== short walks"; tail -10 "$out/e_new.txt"
