"""docs/flex.md's worked examples run as written: every Python block of its "Worked
examples" section, in order, in one namespace with a fresh ``rng`` (each example
asserts that two formulations of its mask agree on the float64 reference)."""

from __future__ import annotations

import pathlib
import re

import numpy as np

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "flex.md"


def _blocks():
    text = DOC.read_text()
    section = text[text.index("## Worked examples"):]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_examples_run(rng):
    blocks = _blocks()
    assert len(blocks) == 7  # setup + six examples
    ns = {"rng": np.random.default_rng(rng.seed_value)}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name} block {i}", "exec"), ns)  # noqa: S102 - our own documentation
