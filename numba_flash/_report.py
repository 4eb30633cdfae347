"""The JSON documents the command line writes (bench, memory, check): one shape for all."""

from __future__ import annotations

import json
import time
from typing import Iterable


def json_document(schema: str, results: Iterable, *, settings: dict | None = None,
                  environment: dict | None = None, **extra) -> dict:
    """``{"schema", "created", "environment", "settings", **extra, "results"}``, each
    result turned into a dict by its ``to_dict()``."""
    return {
        "schema": schema,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": environment or {},
        "settings": settings or {},
        **extra,
        "results": [r.to_dict() for r in results],
    }


def write_json(doc: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
