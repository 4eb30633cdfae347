"""Each case's median time in ``bench_order.py`` records, for A/Bs across processes:

    python3 scripts/order_ms.py RUN.jsonl [RUN.jsonl ...]

``bench_order.py`` prints a variant's time over its baseline's, which hides a switch that moves
both (session 49: ``NUMBA_FLASH_WGMMA_HOLD=1`` lowered softcap's ratio mostly by slowing plain).
This prints, for every file, the median milliseconds of each (mode, case, part) over the timed
orders (``pairs``, ``pairs reversed``, ``with backwards``, ``pairs primed``; the ``host`` lines,
a call's host time, are left out), with the count of timings behind it.
"""

import json
import statistics
import sys
from collections import defaultdict


def medians(path):
    """``{(mode, case, part): (median ms, count)}`` of one ``bench_order.py`` record."""
    times = defaultdict(list)
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec["order"] != "host":
                times[rec["mode"], rec["case"], rec["part"]].append(rec["ms"])
    return {key: (statistics.median(ms), len(ms)) for key, ms in sorted(times.items())}


def main(paths):
    if not paths:
        raise SystemExit(__doc__)
    for path in paths:
        print(path)
        for (mode, case, part), (ms, n) in medians(path).items():
            print(f"  {mode:8s} {case:8s} {part}  {ms:8.4f} ms  (n={n})")


if __name__ == "__main__":
    main(sys.argv[1:])
