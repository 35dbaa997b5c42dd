"""Every code block of the documentation (docs/**/*.md and README.md) runs in a test or says on
the page why it cannot run here (tests/docs_blocks.py has the rules). Here: the rules themselves,
the data blocks (JSON, YAML, TOML validated by the settings model), the blocks that need a tool
(`run-if`), the Python handlers guide walked through against a real daemon, the runbooks against
the alert rules, the README's size and links, and the strict site build with its generated
reference pages. The tutorial is walked through from the built wheel by tests/e2e/test_wheel.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

import asyncpg
import pytest
import yaml

from dispatcher.config.settings import load_settings
from dispatcher.cron.schedules import ScheduleSettings
from tests.docs_blocks import (
    ROOT,
    Block,
    blocks,
    expected_output,
    pages,
    run_walkthrough,
    shown,
)
from tests.harness import free_port, no_server_left

pytestmark = pytest.mark.timeout(300)

SITE = "https://pg-dispatcher.github.io/pg-dispatcher/"
# walk-through pages and the test that runs each
SCRIPT_PAGES = {
    "docs/tutorial.md": "tests/e2e/test_wheel.py",
    "docs/guides/python-handlers.md": "tests/e2e/test_docs_examples.py",
    "docs/guides/recipes.md": "tests/e2e/test_docs_examples.py",
}
DATA = {"json", "yaml", "toml"}
NOT_CODE = {"text"}  # output shown, diagrams, file contents that are not commands

ALL = [b for page in pages() for b in blocks(page)]


def user_env(home: Path) -> dict[str, str]:
    """A new user's environment: no DISPATCHER_* setting, no DATABASE_URL, this venv's commands
    first on PATH, a HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHER_")}
    env.pop("DATABASE_URL", None)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["HOME"] = str(home)
    return env


def test_every_block_runs_somewhere_or_says_why() -> None:
    problems = []
    for block in ALL:
        if not block.language:
            problems.append(f"{block.where}: a fence without a language (```sh, ```text, ...)")
        elif block.marker:
            kind, detail = block.marker
            if kind == "skip" and not re.fullmatch(r"\(.{10,}\)", detail):
                problems.append(f"{block.where}: skip without a reason in parentheses")
            if kind == "tested-by" and not (ROOT / detail.split()[0]).is_file():
                problems.append(f"{block.where}: tested-by names no file: {detail}")
            if kind == "tested-by" and block.page not in (ROOT / detail.split()[0]).read_text():
                # the test must read this page (by its path or its name)
                name = Path(block.page).name
                if name not in (ROOT / detail.split()[0]).read_text():
                    problems.append(f"{block.where}: {detail.split()[0]} never reads the page")
        elif block.page in SCRIPT_PAGES:
            if block.language != "sh":
                problems.append(f"{block.where}: a walk-through runs ```sh blocks only")
        elif block.language not in DATA | NOT_CODE:
            problems.append(f"{block.where}: ```{block.language} runs nowhere: add a marker")
    assert not problems, "\n".join(problems)
    for page, test in SCRIPT_PAGES.items():
        assert Path(page).name in (ROOT / test).read_text(), f"{test} does not run {page}"


@pytest.mark.parametrize(
    "block", [b for b in ALL if b.language in DATA and not b.marker], ids=lambda b: b.where
)
def test_data_blocks_are_valid(block: Block, tmp_path: Path) -> None:
    if block.language == "json":
        json.loads(block.text)
    elif block.language == "yaml":
        assert yaml.safe_load(block.text)
    else:  # settings: [[schedules]] alone are checked one by one (the queue and handler they
        # name belong to the example), any other fragment as a whole configuration file
        parsed = tomllib.loads(block.text)
        if set(parsed) == {"schedules"}:
            for schedule in parsed["schedules"]:
                ScheduleSettings.model_validate(schedule)
        else:
            (tmp_path / "fragment.toml").write_text(block.text)
            load_settings(tmp_path / "fragment.toml", environ={})


@pytest.mark.parametrize(
    "block",
    [b for b in ALL if b.marker and b.marker[0] == "run-if"],
    ids=lambda b: b.where,
)
async def test_blocks_that_need_a_tool_run_where_it_exists(block: Block, tmp_path: Path) -> None:
    assert block.marker is not None
    tool = block.marker[1]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (CI installs it: .ci/run)")
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-ec",
        block.text,
        cwd=ROOT,
        env=user_env(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, out.decode()
    for line in expected_output(block):
        assert shown(line, out.decode().splitlines()), out.decode()


async def test_python_handlers_guide_runs_as_written(tmp_path: Path) -> None:
    """python-handlers.md in an empty directory: the module and the configuration it writes,
    the daemon with PYTHONPATH=., one job that succeeds and one the handler rejects."""
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    env = user_env(tmp_path) | {"DISPATCHER_LISTEN": f"127.0.0.1:{port}"}
    await run_walkthrough(
        "docs/guides/python-handlers.md", work, env, {"localhost:8080": f"localhost:{port}"}, 180
    )
    await no_server_left(work / "var" / "pgdata")


async def test_recipes_run_as_written(tmp_path: Path) -> None:
    """recipes.md in an empty directory: the nightly cleanup (shipped example, 16 units, 10,000
    expired rows deleted and 100 kept, the same night triggered again is `existing`), then one
    job per record under a queue limit with a target that answers 429 once per job."""
    work = tmp_path / "work"
    work.mkdir()
    port, target = free_port(), free_port()
    env = user_env(tmp_path) | {"DISPATCHER_LISTEN": f"127.0.0.1:{port}"}
    replace = {"localhost:8080": f"localhost:{port}", "9003": str(target)}
    await run_walkthrough("docs/guides/recipes.md", work, env, replace, 240)
    await no_server_left(work / "var" / "pgdata")


def test_every_alert_has_a_runbook_and_every_runbook_an_alert() -> None:
    rules = yaml.safe_load((ROOT / "config/prometheus/dispatcher-rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    runbooks = (ROOT / "docs/operations/runbooks.md").read_text()
    sections = set(re.findall(r"^## (\w+)$", runbooks, re.M))
    assert alerts == sections


def test_readme_is_short_and_its_links_reach_pages() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 12 * 1024
    for link in re.findall(rf"\]\({re.escape(SITE)}([^)#]*)", readme):
        page = link.rstrip("/") or "index"
        candidates = [ROOT / "docs" / f"{page}.md", ROOT / "docs" / page / "index.md"]
        assert any(p.is_file() for p in candidates), f"README links to {SITE}{link}: no page"
    assert "](" + "docs/" not in readme  # relative links break on PyPI
    for page in pages():  # links into the repository name files that exist
        for path in re.findall(r"github\.com/pg-dispatcher/pg-dispatcher/blob/main/([^)#\s]+)",
                               page.read_text()):  # fmt: skip
            assert (ROOT / path).exists(), f"{page.name} links to {path}: not in the tree"


def test_site_builds_strictly_with_every_generated_reference(tmp_path: Path) -> None:
    pytest.importorskip("material", reason="the docs extra: pip install -e '.[docs]'")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    site = tmp_path / "site"
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site), strict=True)
    build(config)  # strict: any warning (a missing page, link or anchor) raises
    from dispatcher.api.openapi import openapi_document
    from dispatcher.cli import build_parser
    from dispatcher.config.settings import Settings
    from tools import gendocs

    settings = (site / "reference/settings/index.html").read_text()
    for name in Settings.model_fields:
        # a setting, a section's heading (`http`, `queues.NAME`) or the schedules' (`[[...]]`)
        assert f"<code>{name}" in settings or f"<code>[[{name}]]" in settings, name
    cli = (site / "reference/cli/index.html").read_text()
    for command, _ in gendocs.subcommands(build_parser()):
        assert f"dispatcher {command}</h2>" in cli or f"dispatcher {command}<a" in cli, command
    api = (site / "reference/api/index.html").read_text()
    for path in openapi_document()["paths"]:
        assert path.replace("{", "").replace("}", "") in api.replace("{", "").replace("}", "")
    metrics = (site / "reference/metrics/index.html").read_text()
    for line in gendocs.render_metrics().splitlines()[2:]:
        assert line.split("`")[1] in metrics
    for rule in gendocs.alerts():
        assert f'id="{rule["alert"].lower()}"' in metrics
    fetched = re.compile(  # a script, stylesheet or font from another host
        r'<script[^>]+src="(https?:)?//|<link[^>]+rel="(stylesheet|preconnect|preload)"[^>]+'
        r'href="(https?:)?//'
    )
    for page in site.rglob("*.html"):  # nothing is fetched from elsewhere at run time
        assert not fetched.search(page.read_text()), page


async def test_the_sql_door_python_example_enqueues_in_its_transaction(
    db_url: str, tmp_path: Path
) -> None:
    """docs/guides/sql-door.md's Python block, run twice on a migrated database: one job, the
    lease moved, and the same id again on the second run (the key, not the call, decides)."""
    [block] = [b for b in blocks(ROOT / "docs/guides/sql-door.md") if b.language == "python"]
    script = tmp_path / "enqueue_lease.py"
    script.write_text(block.text)
    env = user_env(tmp_path) | {"DATABASE_URL": db_url}
    printed = []
    for _ in range(2):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        printed.append(out.decode())
    conn = await asyncpg.connect(db_url)
    try:
        job = await conn.fetchrow(
            "SELECT id, key, handler FROM dispatcher.jobs WHERE key = $1",
            "lease-4831:send-move-out-notice:2030-05-31",
        )
        ends_on = await conn.fetchval("SELECT ends_on::text FROM leases WHERE id = 4831")
    finally:
        await conn.close()
    assert job is not None and printed == [f"job {job['id']}\n"] * 2
    assert ends_on == "2030-05-31"


async def test_the_sql_door_node_example_enqueues_in_its_transaction(
    db_url: str, tmp_path: Path
) -> None:
    """docs/guides/sql-door.md's Node.js block, with node-postgres installed from the npm
    registry into a scratch folder, run twice: one job, the same id both times."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js and npm are not installed (Debian: apt-get install nodejs npm)")
    [block] = [b for b in blocks(ROOT / "docs/guides/sql-door.md") if b.language == "js"]
    install = await asyncio.create_subprocess_exec(
        "npm",
        "install",
        "--silent",
        "--no-audit",
        "--no-fund",
        "pg@8",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(install.communicate(), 180)
    if install.returncode != 0:
        pytest.skip(f"npm could not install pg (no npm registry here?): {err.decode()[-300:]}")
    (tmp_path / "enqueue_lease.js").write_text(block.text)
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "CREATE TABLE leases (id bigint PRIMARY KEY, ends_on date NOT NULL);"
            "INSERT INTO leases VALUES (4831, '2030-06-30')"
        )
    finally:
        await conn.close()
    printed = []
    for _ in range(2):
        run = await asyncio.create_subprocess_exec(
            "node",
            "enqueue_lease.js",
            cwd=tmp_path,
            env=user_env(tmp_path) | {"DATABASE_URL": db_url},
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(run.communicate(), 60)
        assert run.returncode == 0
        printed.append(out.decode())
    conn = await asyncpg.connect(db_url)
    try:
        job_id = await conn.fetchval(
            "SELECT id FROM dispatcher.jobs WHERE key = $1",
            "lease-4831:send-move-out-notice:2030-05-31",
        )
        ends_on = await conn.fetchval("SELECT ends_on::text FROM leases WHERE id = 4831")
    finally:
        await conn.close()
    assert job_id is not None and printed == [f"job {job_id}\n"] * 2
    assert ends_on == "2030-05-31"
