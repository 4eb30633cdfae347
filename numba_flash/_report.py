"""The JSON documents the command line writes (check, bench, memory, info, inspect): one
shape for the result lists, and one way to write them (a file, or ``-`` for stdout)."""

from __future__ import annotations

import json
import sys
import time
from typing import Iterable

STDOUT = "-"  # the file name that means standard output (``--json -``)


def json_document(schema: str, results: Iterable, *, settings: dict | None = None,
                  environment: dict | None = None, **extra) -> dict:
    """``{"schema", "created", "environment", "settings", **extra, "results"}``, each
    result turned into a dict by its ``to_dict()`` (a dict is taken as it is)."""
    return {
        "schema": schema,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment or {},
        "settings": settings or {},
        **extra,
        "results": [r if isinstance(r, dict) else r.to_dict() for r in results],
    }


def write_json(doc: dict, path) -> None:
    """Write ``doc`` as indented JSON to ``path``; ``"-"`` writes it to standard output."""
    text = json.dumps(doc, indent=2) + "\n"
    if str(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w") as f:
        f.write(text)


def write_jsonl(rows: Iterable[dict], path) -> None:
    """Write ``rows`` to ``path``, one JSON object a line (the benchmark scripts' logs)."""
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
