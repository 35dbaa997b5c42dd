"""What the commands share: exit codes, a pool on the database for one command, the operator
service on it (acting as the OS user), and how the service's refusals read on a terminal."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.api.filters import FILTERS as JOB_FILTERS
from dispatcher.config.settings import Settings
from dispatcher.operator.errors import Invalid, OperatorError

if TYPE_CHECKING:
    from dispatcher.operator.service import Operator

EXIT_USAGE = 2
EXIT_FAILURE = 1
# what a POSIX tool exits with when a reader closes its pipe (128 + SIGPIPE), as `yes | head` does
EXIT_BROKEN_PIPE = 141


@asynccontextmanager
async def database(
    settings: Settings, *, check_schema: bool = True, create: bool = False
) -> AsyncIterator[Any]:
    """A pool on the configured or embedded database, for one-shot commands. Only `create=True`
    (migrate, restore) may create an embedded database; the others refuse, naming where they
    looked, so a command run from the wrong directory never leaves an empty database behind."""
    from contextlib import AsyncExitStack

    from dispatcher.db import schema
    from dispatcher.db.pool import create_pool, wait_for_database
    from dispatcher.errors import SchemaMismatch
    from dispatcher.runtime.database import resolve_database

    async with AsyncExitStack() as stack:
        dsn = await resolve_database(settings, stack, role="command", create=create)
        await wait_for_database(dsn, timeout_s=15)
        pool = await create_pool(
            dsn, size=2, application_name="dispatcher-cli", pooled=settings.database.pooled
        )
        stack.push_async_callback(pool.close)
        if check_schema:
            async with pool.acquire() as conn:
                try:
                    await schema.check_current(conn)
                except SchemaMismatch as exc:
                    raise SchemaMismatch(f"{database_place(settings)}: {exc}") from None
        yield dsn, pool


def database_place(settings: Settings) -> str:
    """Where a command looked for the database, as the error about it says it."""
    from dispatcher.config.settings import mask_url

    if settings.database_url is not None:
        return f"the database at {mask_url(settings.database_url.get_secret_value())}"
    return f"the embedded database in {settings.state_dir.absolute()}"


@asynccontextmanager
async def operator_service(settings: Settings) -> AsyncIterator[Operator]:
    """The operator service on a pool of this command's own (dispatcher.operator.service):
    the same checks, refusals, metrics and audit line as the API and the console."""
    from dispatcher.cron.service import CronService
    from dispatcher.db.jobs import JobRepository
    from dispatcher.operator.service import Operator

    async with database(settings) as (_dsn, pool):
        repo = JobRepository(pool)
        yield Operator(repo, settings, schedules=CronService(pool, repo, settings.schedules))


def operate(settings: Settings, body: Callable[[Operator], Awaitable[int]]) -> int:
    """Run `body` with the operator service; its exit status."""

    async def run() -> int:
        async with operator_service(settings) as operator:
            return await body(operator)

    return asyncio.run(run())


def client_bin_dir(settings: Settings) -> Path:
    from dispatcher.db.embedded import default_bin_dir

    return settings.embedded_postgres_bin or default_bin_dir()


# the CLI spelling of the fields the operator service and the request models name
OPTION_NAMES = {
    "queue": "--queue",
    "dead_reason": "--reason",
    "tenant": "--tenant",
    "dead_since": "--since",
    "dead_before": "--before",
    "limit": "--limit",
}
# the options that name the fields the operator service refuses (Invalid.field)
FIELD_OPTIONS = {
    **OPTION_NAMES,
    "due_at": "--at",
    "from": "--from",
    "to": "--to",
    "period_start": "--period",
    # queues set (run-time settings: docs/guides/run-windows.md)
    "rate_per_s": "--rate-per-s",
    "burst": "--burst",
    "max_inflight": "--max-inflight",
    "key_rate_per_s": "--key-rate-per-s",
    "key_burst": "--key-burst",
    "key_max_inflight": "--key-max-inflight",
    "windows": "--window",
    # jobs bulk: the job list's filters by their options
    "ids": "--id",
    "all": "--all",
    **{f"filter.{name}": f"--{name.replace('_', '-')}" for name in JOB_FILTERS},
}


def cli_spelling(message: str) -> str:
    """A refusal written for the API (`dead_since`, `"all": true`) in the CLI's own words
    (`--since`, `--all`): the fix a user reads must be one they can type here."""
    message = message.replace('send "all": true', "pass --all").replace('"all": true', "--all")
    return re.sub(
        r"\b(" + "|".join(OPTION_NAMES) + r")\b", lambda m: OPTION_NAMES[m.group(1)], message
    )


def refusal(exc: OperatorError) -> tuple[int, str]:
    """The exit status and the line a refusal of the operator service prints: invalid input
    is a usage error (2) naming the option; not found or not now is a failure (1)."""
    if isinstance(exc, Invalid):
        option = FIELD_OPTIONS.get(exc.field or "", exc.field)
        line = f"{option}: {exc.reason}" if option else exc.reason
        return EXIT_USAGE, f"dispatcher: {line}"
    return EXIT_FAILURE, f"dispatcher: {exc.detail}"


def plain(value: Any) -> str:
    """A value as a table cell: None as -, JSON as JSON, times as RFC 3339."""
    import json
    from datetime import datetime

    from dispatcher.core import rfc3339

    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, datetime):
        return rfc3339.format(value)
    return str(value)
