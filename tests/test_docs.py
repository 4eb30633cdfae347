"""The command-line examples in docs/cli.md are the commands' real output.

A fenced block preceded by a marker comment is checked::

    <!-- cli-output: numba-flash inspect --pass forward --dtype float32 --head-dim 64 -->
    ```
    $ numba-flash inspect --pass forward --dtype float32 --head-dim 64      # a comment
    ...what it prints (stdout and stderr, as a terminal shows them)...
    rc=1                                            (optional: the exit code, else 0)
    ```

The command runs in-process (click's test runner, so a 150-column table width as
when the output is not a terminal) and its output is compared with the block after
normalising what legitimately varies between runs and machines: timings, a seed the
command did not fix, file paths, the errors a check measures (they follow the
kernels' summation order and the BLAS of the reference), package versions, table
padding, and the assembler's numbers (registers, spills, ...) when the assembler is
not the one the docs were made with.  Instruction counts, kernel names, tiles, notes,
limits and PASS/FAIL are compared as they are.

Markers ``<!-- cli-output slow: ... -->`` (the simulator's default check grid, about a
minute) run only with ``NUMBA_FLASH_DOCS_SLOW=1``.  Examples other than ``inspect``
describe the CUDA simulator (no GPU), and are skipped on a GPU machine.  Blocks not
marked (the H200 measurements) are not run.

To regenerate the blocks that no longer match::

    python tests/test_docs.py --update [--slow] [--force]

(``--force``: rewrite the blocks that match too, e.g. for fresh timings.)
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import sys
import warnings
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "cli.md")
MARKER = re.compile(r"^<!-- cli-output( slow)?: (numba-flash\b.*?) -->\s*$")
FENCE = "```"
SLOW = os.environ.get("NUMBA_FLASH_DOCS_SLOW", "") not in ("", "0")
UPDATE_HINT = "regenerate with: python tests/test_docs.py --update"


@dataclass
class Block:
    command: str  # "numba-flash inspect ..."
    slow: bool
    first: int  # index of the "$ command" line in the document's lines
    end: int  # index of the closing fence
    prompt: str  # the "$ ..." line as written (with its comment)
    output: list  # the lines after the prompt (without the rc= line)
    rc: int

    @property
    def args(self) -> list:
        return shlex.split(self.command)[1:]

    @property
    def id(self) -> str:
        return self.command.replace("numba-flash ", "")


def doc_blocks(lines: list) -> list:
    """The marked blocks of docs/cli.md (its lines, without newlines)."""
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        slow, command = bool(m.group(1)), m.group(2).strip()
        where = f"docs/cli.md:{i + 1}"
        assert i + 2 < len(lines) and lines[i + 1].strip() == FENCE, f"{where}: the marker is not followed by ```"
        prompt = lines[i + 2]
        assert prompt.startswith("$ "), f"{where}: the block does not start with '$ {command}'"
        written = prompt[2:].split("  #")[0].split(" #")[0].strip()
        assert shlex.split(written) == shlex.split(command), f"{where}: marker {command!r} vs block {written!r}"
        end = next((j for j in range(i + 3, len(lines)) if lines[j].strip() == FENCE), None)
        assert end is not None, f"{where}: the block is not closed"
        output = lines[i + 3 : end]
        rc = 0
        if output and re.fullmatch(r"rc=\d+", output[-1].strip()):
            rc = int(output.pop().strip()[3:])
        blocks.append(Block(command, slow, i + 2, end, prompt, output, rc))
    return blocks


def read_doc() -> list:
    with open(DOC, encoding="utf-8") as f:
        return f.read().split("\n")


def _main():
    try:
        from numba_flash_cli.main import main
    except ImportError:  # the project is not pip-installed: import cli/ from the checkout
        sys.path.insert(0, ROOT)
        from cli.main import main
    return main


def run(block: Block) -> tuple:
    """(exit code, output lines) of the block's command, run in-process."""
    from click.testing import CliRunner

    main = _main()
    runner = CliRunner()
    # in an empty temporary directory: files an example names (out.json) land there
    with warnings.catch_warnings(), runner.isolated_filesystem():
        warnings.simplefilter("ignore")  # a warning is no part of a documented output
        result = runner.invoke(main, block.args, prog_name="numba-flash", catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError(f"{block.command} raised:\n" + "".join(traceback.format_exception(*result.exc_info)))
    lines = result.output.rstrip("\n").split("\n")
    return result.exit_code, [ln.rstrip() for ln in lines]


# --------------------------------------------------------------------------------------
# normalising
# --------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BARS = re.compile(r" *([│┃┆┊]) *")
_SCI = re.compile(r"-?\d\.\d+e[+-]\d+")
ASSEMBLER_ROWS = ("registers / thread", "spill stores / loads", "stack frame", "shared memory (assembler)",
                  "local memory (assembler)")  # fmt: skip
ASSEMBLER_LINE = "registers/spills from:"


def _cells(line: str) -> list:
    return [c.strip() for c in re.split(r"[│┃]", line)]


def normalize(lines: list, command: str, same_assembler: bool = True) -> list:
    """What may differ between two runs of ``command`` replaced by placeholders, and
    table padding and rules collapsed (so column widths do not matter)."""
    args = shlex.split(command)
    sub = args[1] if len(args) > 1 else ""
    out = []
    title = None
    for raw in lines:
        line = _ANSI.sub("", raw).rstrip()
        line = re.sub(r"\((\d+(\.\d+)?) s\)", "(<t> s)", line)  # check: seconds per case
        line = re.sub(r"\bwrote \S+", "wrote <path>", line)
        if "--seed" not in args:
            line = re.sub(r"\bseed \d+", "seed <seed>", line)
        if line and line[0] not in "┏┡├└┌┃│╇┼╋┗┛┣┫" and not line.startswith(" "):
            title = line.strip()  # the line above a table is its title (rich: title_justify left)
        is_row = line.startswith(("│", "┃"))
        if is_row:
            cells = _cells(line)
            if sub == "check" and len(cells) >= 9:  # ['', #, case, output, max abs, rel, limit, result, '']
                cells[4] = _SCI.sub("<err>", cells[4])
                cells[5] = _SCI.sub("<err>", cells[5])
                if "base" in cells[6]:
                    cells[6] = "<limit from the baseline>"
                line = "│".join(cells)
            elif sub == "info" and title == "software" and len(cells) == 4:
                line = "│".join(cells[:2] + ["<version>", ""])
            elif sub == "inspect" and not same_assembler and cells[1] in ASSEMBLER_ROWS:
                line = "│".join(cells[:2] + ["<assembler>"] * (len(cells) - 3) + [""])
        if sub == "inspect" and not same_assembler and line.startswith(ASSEMBLER_LINE):
            line = ASSEMBLER_LINE + " <assembler>"
        line = _BARS.sub(r"\1", line)
        line = re.sub(r"([━─═])[━─═]*", r"\1", line)
        out.append(line.rstrip())
    while out and not out[-1]:
        out.pop()
    return out


def _assembler_line(lines: list) -> str | None:
    return next((ln.strip() for ln in lines if ln.startswith(ASSEMBLER_LINE)), None)


def compare(block: Block, rc: int, actual: list) -> list:
    """Differences (a unified diff, as lines) between the documented and the actual
    output, after normalising; [] when they agree."""
    same = _assembler_line(block.output) == _assembler_line(actual)
    want = normalize(block.output, block.command, same)
    got = normalize(actual, block.command, same)
    diff = list(difflib.unified_diff(want, got, "docs/cli.md", "actual", lineterm="", n=2))
    if rc != block.rc:
        diff.insert(0, f"exit code: documented {block.rc}, actual {rc}")
    return diff


# --------------------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - the update script needs no pytest
    pytest = None

if pytest is not None:
    BLOCKS = doc_blocks(read_doc())

    def test_docs_have_checked_examples():
        subs = {b.args[0] for b in BLOCKS}
        assert {"check", "info", "inspect"} <= subs, subs
        assert sum(not b.slow for b in BLOCKS) <= 10, "keep the docs test fast: mark long runs slow"

    @pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
    def test_documented_output(block):
        from numba_flash._numba_cuda import SIMULATOR

        if block.slow and not SLOW:
            pytest.skip("a slow example: NUMBA_FLASH_DOCS_SLOW=1 runs it")
        if block.args[0] != "inspect" and not SIMULATOR:
            pytest.skip("documents the CUDA simulator (no GPU); a GPU is here")
        rc, actual = run(block)
        diff = compare(block, rc, actual)
        assert not diff, f"docs/cli.md: `{block.command}` prints something else now ({UPDATE_HINT}):\n" + "\n".join(diff)

    def test_normalize():
        doc = ["numba-flash check: ...; 1 case(s), seed 5", "  PASS  [1/1] x  (5.4 s)",
               "┃ # ┃ case ┃ output ┃ max abs err ┃  rel err ┃    limit ┃ result ┃",
               "│ 1 │ x    │ O      │    1.31e-07 │ 1.08e-07 │ 1.00e-05 │ PASS   │     "]  # fmt: skip
        now = ["numba-flash check: ...; 1 case(s), seed 9", "  PASS  [1/1] x  (12.0 s)",
               "┃ # ┃ case ┃ output ┃ max abs err ┃ rel err ┃ limit ┃ result ┃",
               "│ 1 │ x │ O │ 2.00e-07 │ 1.00e-07 │ 1.00e-05 │ PASS │"]  # fmt: skip
        assert normalize(doc, "numba-flash check") == normalize(now, "numba-flash check")
        assert normalize(doc, "numba-flash check --seed 5") != normalize(now, "numba-flash check --seed 5")
        worse = now[:3] + ["│ 1 │ x │ O │ 2.00e-07 │ 1.00e-07 │ 1.00e-04 │ FAIL │"]
        assert normalize(doc, "numba-flash check") != normalize(worse, "numba-flash check")
        a = ["│ registers / thread │ 242 │", "│ fma │ 456 │", "registers/spills from: nvJitLink 13.5"]
        b = ["│ registers / thread │ n/a │", "│ fma │ 456 │", "registers/spills from: n/a (no ptxas)"]
        assert normalize(a, "numba-flash inspect", False) == normalize(b, "numba-flash inspect", False)
        assert normalize(a, "numba-flash inspect") != normalize(b, "numba-flash inspect")
        c = ["│ registers / thread │ 242 │", "│ fma │ 455 │", "registers/spills from: nvJitLink 13.5"]
        assert normalize(a, "numba-flash inspect", False) != normalize(c, "numba-flash inspect", False)


# --------------------------------------------------------------------------------------
# python tests/test_docs.py --update [--slow]
# --------------------------------------------------------------------------------------


def update(slow: bool = False, force: bool = False) -> int:
    """Rewrite the marked blocks whose output no longer matches (``slow``: those marked
    slow too; ``force``: every block run, matching or not); returns how many were
    rewritten."""
    from numba_flash._gpu_probe import use_simulator_without_gpu

    simulator = use_simulator_without_gpu()
    lines = read_doc()
    changed = 0
    for block in reversed(doc_blocks(lines)):  # bottom-up: line numbers stay valid
        if block.slow and not slow:
            print(f"skipped (slow; --slow runs it): {block.command}")
            continue
        if block.args[0] != "inspect" and not simulator:
            print(f"skipped (documents the simulator; a GPU is here): {block.command}")
            continue
        rc, actual = run(block)
        if not force and not compare(block, rc, actual):
            print(f"up to date: {block.command}")
            continue
        body = [block.prompt] + actual + ([f"rc={rc}"] if rc else [])
        lines[block.first : block.end] = body
        changed += 1
        print(f"rewritten: {block.command}")
    if changed:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    return changed


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Check or regenerate the command-line examples in docs/cli.md.")
    ap.add_argument("--update", action="store_true", help="rewrite the blocks that no longer match")
    ap.add_argument("--slow", action="store_true", help="the slow examples too")
    ap.add_argument("--force", action="store_true", help="rewrite every block run, even those that match")
    ns = ap.parse_args()
    if ns.update:
        n = update(slow=ns.slow, force=ns.force)
        print(f"{n} block(s) rewritten in docs/cli.md")
    else:
        sys.exit(__import__("pytest").main([__file__, "-q", "-p", "no:cacheprovider"]))
