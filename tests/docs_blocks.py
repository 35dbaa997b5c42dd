"""The documentation's code blocks, as the tests that run them see them.

Every fenced block of docs/**/*.md and README.md has a language. A block that cannot run here
says so on the line right above it, with the reason, in an HTML comment the site does not show:

    <!-- docs-test: skip (why, and which test covers it instead) -->
    <!-- docs-test: tested-by tests/PATH.py (that test reads and runs this block) -->
    <!-- docs-test: run-if COMMAND -->   (run from the repository's root when COMMAND exists)

A page in SCRIPT_PAGES is a walk-through: its shell blocks run in order in one bash, in an empty
directory, as a reader would type them; a top-level `# ` line inside a shell block is output the
block must print (a JSON object ending in `,...}` names some of its fields)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER = re.compile(r"^<!-- docs-test: (skip|tested-by|run-if) (.+) -->$")
FENCE = re.compile(r"^```(\S*)$")
HEREDOC = re.compile(r"<<-?'?(\w+)'?")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository's root
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    marker: tuple[str, str] | None  # (kind, detail)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = lines.index("```", index + 1)
        marker = MARKER.match(lines[index - 1]) if index else None
        found.append(
            Block(
                page=str(path.relative_to(ROOT)),
                line=index + 1,
                language=opening.group(1),
                text="\n".join(lines[index + 1 : end]) + "\n",
                marker=(marker.group(1), marker.group(2)) if marker else None,
            )
        )
        index = end + 1
    return found


def blocks_tested_by(path: Path, test_file: str) -> list[Block]:
    """The blocks of `path` marked `tested-by <test_file>` (its path from the repository root,
    e.g. `tests/db/test_search_migration.py`), in page order."""
    return [b for b in blocks(path) if b.marker == ("tested-by", test_file)]


def sql_statements(block: Block) -> list[str]:
    """The statements of a SQL block, each to run on its own (a concurrent index build may not
    run inside a transaction, which a multi-statement string would be)."""
    return [s.strip() for s in block.text.split(";") if s.strip()]


def expected_output(block: Block) -> list[str]:
    """The top-level `# ` lines of a shell block outside its here-documents."""
    shown: list[str] = []
    ending: str | None = None
    for line in block.text.splitlines():
        if ending is not None:
            ending = None if line == ending else ending
            continue
        if line.startswith("# "):
            shown.append(line.removeprefix("# "))
        heredoc = HEREDOC.search(line)
        if heredoc:
            ending = heredoc.group(1)
    return shown


def contains(whole: object, part: object) -> bool:
    """`part` names some of `whole`'s fields, at any depth; lists match item by item."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(
            k in whole and contains(whole[k], v) for k, v in part.items()
        )
    if isinstance(part, list):
        return (
            isinstance(whole, list)
            and len(whole) == len(part)
            and all(contains(w, p) for w, p in zip(whole, part, strict=True))
        )
    return whole == part


def shown(expected: str, output: list[str]) -> bool:
    """Whether an output line matches the page's: a JSON object ending in `,...}` names some of
    the fields (any order, objects inside it too); any other line is exact."""
    if expected.startswith("{") and expected.endswith(",...}"):
        subset = json.loads(expected.removesuffix(",...}") + "}")
        for line in output:
            try:
                whole = json.loads(line)
            except ValueError:
                continue
            if contains(whole, subset):
                return True
        return False
    return expected in output


SEPARATOR = "@@docs-test: block {} done@@"


def walkthrough(page: str, replace: dict[str, str]) -> tuple[str, list[Block]]:
    """One bash script of a page's shell blocks, in order, each followed by a separator line,
    with `replace` applied (free ports for fixed ones, a wheel for the published name)."""
    runnable = [b for b in blocks(ROOT / page) if b.language == "sh" and b.marker is None]
    parts = ["set -e"]
    for number, block in enumerate(runnable):
        text = block.text
        for old, new in replace.items():
            text = text.replace(old, new)
        parts += [text, f"echo '{SEPARATOR.format(number)}'"]
    return "\n".join(parts) + "\n", runnable


async def run_walkthrough(
    page: str, cwd: Path, env: dict[str, str], replace: dict[str, str], timeout_s: float
) -> None:
    """Run a walk-through page and check each block's output; on failure or timeout, every
    process it started (its process group: the daemon drains and stops its database) ends."""
    script, runnable = walkthrough(page, replace)
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        raise AssertionError(
            f"{page} did not finish within {timeout_s} s:\n{out.decode()}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # servers a failed block left running
            os.killpg(proc.pid, signal.SIGTERM)
    text = out.decode()
    chunks = re.split(r"@@docs-test: block \d+ done@@\n", text)
    done = len(chunks) - 1
    assert proc.returncode == 0 and done == len(runnable), (
        f"{page}: block {runnable[min(done, len(runnable) - 1)].where} failed "
        f"(exit {proc.returncode}):\n{text}"
    )
    for block, chunk in zip(runnable, chunks, strict=False):
        output = [x.rstrip("\r") for x in chunk.splitlines()]
        for line in expected_output(block):
            assert shown(line, output), f"{block.where} shows {line!r}; got:\n{chunk}"
