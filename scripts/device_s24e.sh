#!/usr/bin/env bash
# Session 24, call 5: where the ordered dQ loses — the dQ kernel (pass) against the ordered
# dQ in turn, as built and with the timing probes NUMBA_FLASH_DQ_PROBE=nowait (the writers
# never wait for their turn) and =nowrite (no reductions), each in its own process.
set -u
out=$1
. scripts/device_ab.sh
for probe in "" nowait nowrite; do
  NUMBA_FLASH_DQ_PROBE=$probe DQ_ORDERS=pass,ordered NUMBA_FLASH_DQ_WATCHDOG=4000000 timeout 110 python3 \
    scripts/probe_dq_order.py "$out/p_$probe.jsonl" 1,16,4096,128,0 4,16,4096,128,1 > "$out/p_$probe.txt" 2>&1
  echo "probe '$probe' rc=$? at ${SECONDS}s" >> "$out/p_$probe.txt"
  grep -v "^{" "$out/p_$probe.txt" | tail -5
done
