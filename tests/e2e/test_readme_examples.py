"""The documentation's first examples, followed as a new user would on a fresh quick start: the
embedded database (no DISPATCHER_DATABASE_URL), the quick start's curl commands (docs/index.md),
then the SQL door's example (docs/guides/sql-door.md) pasted into the psql that `dispatcher
db-url` names. Each prints what the page shows; an edit that breaks an example, or a code change
that changes its output, fails here."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path

import pytest

from tests.harness import daemon_on, no_server_left, run_cli, terminate

pytestmark = pytest.mark.timeout(300)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(title: str, page: str = "index.md") -> str:
    text = (DOCS / page).read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def examples(block: str) -> list[tuple[str, list[str]]]:
    """(command, the `# ` lines under it) for each paragraph of a shell block."""
    found = []
    for paragraph in block.strip().split("\n\n"):
        lines = paragraph.splitlines()
        command = "\n".join(x for x in lines if not x.startswith("#"))
        found.append((command, [x.removeprefix("# ") for x in lines if x.startswith("# ")]))
    return found


def shown(expected: str, output: list[str]) -> bool:
    """Whether an output line matches the page's: a JSON object ending in `...` names some
    of the fields (any order); any other line is exact."""
    if expected.startswith("{") and expected.endswith(",...}"):
        subset = json.loads(expected.removesuffix(",...}") + "}")
        for line in output:
            try:
                whole = json.loads(line)
            except ValueError:
                continue
            if isinstance(whole, dict) and subset.items() <= whole.items():
                return True
        return False
    return expected in output


async def shell(command: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_quick_start_then_sql_door_examples_print_what_the_readme_shows(
    tmp_path: Path,
) -> None:
    state = tmp_path / "var"  # the quick start's ./var
    async with daemon_on(state) as daemon:
        # the quick start's curl commands, against this daemon's port instead of 8080
        [block] = [b for b in fenced(section("Quick start"), "sh") if "curl" in b]
        for command, expected in examples(block):
            assert expected, f"an example without its output: {command}"
            local = command.replace("localhost:8080", f"127.0.0.1:{daemon.port}")
            code, out = await shell(local)
            lines = [x.rstrip("\r") for x in out.splitlines()]
            assert code == 0, out
            for line in expected:
                assert shown(line, lines), f"the docs show {line!r}; got:\n{out}"

        # the SQL door: the psql command db-url prints, fed the page's SQL
        urls = await run_cli(state, "db-url")
        assert urls.code == 0, urls.stderr
        [advice] = [x for x in urls.stderr.splitlines() if x.startswith("connect with: ")]
        psql = shlex.split(advice.removeprefix("connect with: "))
        section_text = (DOCS / "guides" / "sql-door.md").read_text()
        [sql] = fenced(section_text, "sql")
        [printed] = fenced(section_text, "text")
        for attempt in ("first", "again"):  # pasted twice: the same job, not a conflict
            proc = await asyncio.create_subprocess_exec(
                *psql,
                "-X",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(sql.encode()), 60)
            assert proc.returncode == 0 and b"ERROR" not in err, err.decode()
            got = [x.rstrip() for x in out.decode().strip().splitlines()]
            want = [x.rstrip() for x in printed.strip().splitlines()]
            if attempt == "again":  # the table and the lease exist by now
                want = [x if x != "INSERT 0 1" else "INSERT 0 0" for x in want]
            assert got == want, f"{attempt}: the page shows\n{printed}\ngot\n{out.decode()}"

        # the job it made waits for its due time, beside the HTTP one
        listing = await run_cli(state, "jobs", "list", "--json")
        jobs = {j["key"]: j for j in json.loads(listing.stdout)}
        sql_job = jobs["lease-4831:send-move-out-notice:2030-05-31"]
        assert (sql_job["id"], sql_job["state"]) == (2, "scheduled")
        await terminate(daemon)
    await no_server_left(state / "pgdata")
