#!/usr/bin/env bash
# Session 20, call 7: the dynamic scheduler against the static order in one process
# (scripts/ab_scheduler.py): call 6 showed causal rows ±8% apart between processes.
set -u
out=$1
. scripts/device_ab.sh
timeout 150 python3 scripts/ab_scheduler.py "$out/ab.jsonl" > "$out/ab.txt" 2>&1
echo "ab rc=$? at ${SECONDS}s" >> "$out/ab.txt"
tail -5 "$out/ab.txt"
