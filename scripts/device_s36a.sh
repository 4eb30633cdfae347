#!/usr/bin/env bash
# Session 36, call 1: the A/B of session 35's opt-in L2 rule (`NUMBA_FLASH_L2_SECTIONS=unshared`,
# spec.l2_sections' `unshared`) against the default, in turn, a process each: bench_knobs.py
# `batched` ((16,16,1024/1536,128), (8,16,2048,128) causal; (4,16,4096,128) causal the control),
# twice each side, then `walks` (window vs causal; 16 varlen sequences vs the padded batch).
# Expected (written before the run, from traffic.dram and s35's ncu): batched forwards 1.3-1.8x
# faster with `unshared`, their backwards and the control unchanged (within ~3%); walks'
# padded and varlen forwards both faster, their ratio about as now (~0.9), window/causal unchanged.
# (Ran at 23de609. The rule became the default in 9ce07f8, which dropped the value `unshared`:
# `NUMBA_FLASH_L2_SECTIONS=shared` is now the other side of this A/B.)
set -u
out=$1
export NUMBA_CACHE_DIR=/tmp/nbcache
. scripts/device_ab.sh
export KNOB_UNTIL=${KNOB_UNTIL:-430}
knob on batched
knob unshared batched NUMBA_FLASH_L2_SECTIONS=unshared
knob unshared2 batched NUMBA_FLASH_L2_SECTIONS=unshared
knob on2 batched
knob walks_on walks
knob walks_unshared walks NUMBA_FLASH_L2_SECTIONS=unshared
knob walks_unshared2 walks NUMBA_FLASH_L2_SECTIONS=unshared
knob walks_on2 walks
python3 - "$out/knobs.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    print(f"{r['group']:7s} {r['label']:16s} " + "  ".join(f"{n} {f:.3f}/{b:.3f}" for n, (f, b) in r["ms"].items()))
PY
exit 0
