"""The `dispatcher` command: run the daemon, migrate, check the configuration, operate jobs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from dispatcher import __version__
from dispatcher.config.settings import Settings, load_settings
from dispatcher.console import admin as console_admin
from dispatcher.core import rfc3339
from dispatcher.errors import DispatcherError
from dispatcher.model import STATES
from dispatcher.observability import logs

EXIT_USAGE = 2
EXIT_FAILURE = 1

DESCRIPTION = """\
A durable delayed-job dispatcher for PostgreSQL. Jobs arrive over HTTP (POST /v1/jobs), from the
SQL function dispatcher.enqueue(...) inside your own transaction, or from cron schedules; each is
delivered at least once to an HTTPS target, a configured SQL statement or a Python handler, within
per-queue rate and concurrency limits.

Without DISPATCHER_DATABASE_URL the daemon runs its own PostgreSQL in DISPATCHER_STATE_DIR
(default ./var). Every setting comes from --config FILE (TOML) and DISPATCHER_* variables."""


JOB_ID_MAX = 2**63 - 1  # bigint
CONFIG_HELP = "TOML configuration file (default: $DISPATCHER_CONFIG, else built-in)"
# what a POSIX tool exits with when a reader closes its pipe (128 + SIGPIPE), as `yes | head` does
EXIT_BROKEN_PIPE = 141


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`, else a usage error that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer from {low} to {high}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatcher",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dispatcher {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
        return p

    run = command("run", "run the daemon until SIGTERM/SIGINT (then drain gracefully)")
    run.epilog = (
        "tracing: off unless the standard OpenTelemetry variables ask for it, e.g. "
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 (needs the 'tracing' extra; "
        "README: Tracing)"
    )
    command("migrate", "apply pending database migrations and exit")
    config = command("config", "files shipped with the package: the annotated settings file")
    config_sub = config.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    config_example = config_sub.add_parser(
        "example",
        help="print a shipped file (default: the annotated dispatcher.toml, every setting)",
        description="print a shipped file: dispatcher config example > dispatcher.toml",
    )
    config_example.add_argument("name", nargs="?", default="dispatcher.toml", metavar="NAME")
    config_example.add_argument("--list", action="store_true", help="list the shipped files")
    command("check-config", "validate the configuration and print it with secrets masked")
    command(
        "db-url",
        "print the URL of the database on stdout (embedded: its Unix socket; for libraries and "
        'psql "$(dispatcher db-url)") and, on stderr, the psql command; starts nothing, works '
        "while the daemon runs (exit 1 when the embedded server is not running)",
    )

    status = command("status", "jobs per queue and state, oldest ready age, dead letters")
    status.add_argument("--json", action="store_true", help="one JSON document for scripts")

    schedules = command(
        "schedules", "schedules: next fire, last run receipt, missed periods; pause, resume"
    )
    schedules.add_argument("--json", action="store_true", help="one JSON document for scripts")
    schedule_actions = schedules.add_subparsers(dest="schedule_action", metavar="ACTION")
    for action, help_text in (
        (
            "pause",
            "pause a schedule on every daemon of this database (persisted; its periods are "
            "recorded missed with reason 'paused', never backfilled silently)",
        ),
        ("resume", "resume a paused schedule (its missed periods stay listed for catch-up)"),
    ):
        p = schedule_actions.add_parser(action, help=help_text, description=help_text)
        p.add_argument("name", help="schedule name from [[schedules]]")
        p.add_argument("--json", action="store_true", help="one JSON document for scripts")
    catch_up = command("catch-up", "create the runs of missed periods of a schedule (idempotent)")
    catch_up.add_argument("schedule", help="schedule name from [[schedules]]")
    catch_up.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="T",
        help="first period start, RFC 3339 (e.g. 2026-05-30T02:00:00Z)",
    )
    catch_up.add_argument(
        "--to",
        dest="end",
        required=True,
        metavar="T",
        help="last period start, RFC 3339 (inclusive)",
    )
    catch_up.add_argument(
        "--dry-run",
        action="store_true",
        help="list the periods it would create (and those that already have a run); create nothing",
    )
    catch_up.add_argument("--json", action="store_true")

    backup = command(
        "backup",
        "write the dispatcher schema (jobs, idempotency keys, run receipts) to FILE with "
        "pg_dump; consistent while the daemon runs",
    )
    backup.add_argument("file", metavar="FILE", help="archive to write (pg_dump custom format)")
    backup.add_argument("--force", action="store_true", help="replace FILE if it exists")
    restore = command(
        "restore",
        "load FILE (from dispatcher backup) in one transaction; stop the daemon first. "
        "Refuses a database that already has a dispatcher schema unless --force",
    )
    restore.add_argument("file", metavar="FILE", help="archive written by dispatcher backup")
    console_admin.add_commands(command("console", "the web console: list and revoke sessions"))
    restore.add_argument(
        "--force", action="store_true", help="drop the existing dispatcher schema and replace it"
    )

    jobs = command("jobs", "inspect and operate jobs (works whether the daemon runs or not)")
    jobs_sub = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = jobs_sub.add_parser("list", help="list jobs, newest first")
    listing.add_argument("--state", choices=STATES)
    listing.add_argument("--queue")
    listing.add_argument("--key", help="the job with this idempotency key (exact)")
    listing.add_argument("--tenant", help="jobs of this tenant")
    listing.add_argument("--run-key", help="units of a cron run, e.g. nightly:2026-05-31T02:00:00Z")
    listing.add_argument("--handler", help='"http" or a handler name from the configuration')
    listing.add_argument(
        "--due-before", metavar="T", help="due before T (exclusive), RFC 3339 with offset"
    )
    listing.add_argument(
        "--due-after", metavar="T", help="due at or after T (inclusive), RFC 3339 with offset"
    )
    listing.add_argument(
        "--limit", type=bounded_int(1, 1000), default=50, help="1 to 1000 (default 50)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON document for scripts")
    for action, help_text in (
        ("show", "show one job and its attempt history"),
        ("retry", "retry a dead or cancelled job with a new attempt budget"),
        ("cancel", "cancel a waiting job (a running one is not retried)"),
    ):
        p = jobs_sub.add_parser(action, help=help_text)
        p.add_argument("id", type=bounded_int(1, JOB_ID_MAX), help="job id")
        p.add_argument("--json", action="store_true")
        if action == "show":
            p.add_argument(
                "--attempts",
                type=bounded_int(0, 1000),
                default=10,
                metavar="N",
                help="also show the newest N attempts of its history (default 10; 0: none)",
            )
    add_operator_commands(command, jobs_sub)
    accept_config_after_actions(parser)
    return parser


def accept_config_after_actions(parser: argparse.ArgumentParser, depth: int = 0) -> None:
    """Let `--config FILE` follow any action (`jobs list --config F`), not only its command.

    A nested parser's defaults overwrite what its parent parsed, so the nested option's
    default is SUPPRESS: `jobs --config F list` keeps F; `jobs list --config F` sets it."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in set(action.choices.values()):
            if depth > 0 and "--config" not in child._option_string_actions:
                child.add_argument(
                    "--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP
                )
            accept_config_after_actions(child, depth + 1)


def add_operator_commands(command: Callable[..., argparse.ArgumentParser], jobs_sub: Any) -> None:
    """`jobs discard|redrive|reschedule` and `queues` (pause, resume, the overview)."""
    discard = jobs_sub.add_parser(
        "discard",
        help="discard a dead job (ID), or in bulk every dead job matching the filters",
        description="Discard dead letters: terminal state `discarded`, kept (and pruned) like "
        "the dead letter. Give a job ID, or filters (or --all) for a bulk discard.",
    )
    discard.add_argument("id", nargs="?", type=bounded_int(1, JOB_ID_MAX), help="one dead job")
    dead_letter_options(discard)
    redrive = jobs_sub.add_parser(
        "redrive",
        help="bulk: dead jobs matching the filters go back to ready with a fresh attempt budget",
        description="Redrive dead letters in batches of 1,000; repeating it moves nothing twice.",
    )
    dead_letter_options(redrive)
    reschedule = jobs_sub.add_parser(
        "reschedule",
        help="move a scheduled or ready job to another due time, or run it now",
    )
    reschedule.add_argument("id", type=bounded_int(1, JOB_ID_MAX), help="job id")
    reschedule.add_argument(
        "--at", required=True, metavar="TIME|now", help='RFC 3339 with offset, or "now"'
    )
    reschedule.add_argument("--json", action="store_true")

    queues = command(
        "queues",
        "queues: paused or not, jobs per state, oldest ready age, limits; pause or resume one",
    )
    queues.add_argument("--json", action="store_true", help="one JSON document for scripts")
    queues_sub = queues.add_subparsers(dest="action", metavar="ACTION")
    for action, help_text in (
        ("pause", "stop claiming the queue's jobs on every daemon (intake and due-scan go on)"),
        ("resume", "claim the queue's jobs again"),
    ):
        p = queues_sub.add_parser(action, help=help_text, description=help_text)
        p.add_argument("name", help="queue name (see `dispatcher queues`)")
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    queue_settings_parsers(queues_sub)


def queue_settings_parsers(queues_sub: Any) -> None:
    """`queues set` and `queues reset`: run-time overrides of a queue's limits and windows."""
    from dispatcher.operator.queue_limits import LIVE_SETTINGS

    text = (
        "change a queue's limits or run windows at run time, on every daemon within a second; "
        "the change wins over the configuration file until `queues reset`"
    )
    p = queues_sub.add_parser("set", help=text, description=text)
    p.add_argument("name", help="queue name (see `dispatcher queues`)")
    for option, kind in (("rate-per-s", float), ("burst", int), ("max-inflight", int)):
        p.add_argument(f"--{option}", type=kind)
        p.add_argument(f"--key-{option}", type=kind, help="per key (issue 22 point 4)")
    p.add_argument(
        "--window",
        action="append",
        dest="windows",
        metavar="WINDOW",
        help='run window, e.g. "Mon-Fri 18:00-07:00 Europe/Berlin"; repeat for several',
    )
    p.add_argument("--no-windows", action="store_true", help="claim at any time (no windows)")
    p.add_argument(
        "--unset",
        action="append",
        default=[],
        choices=LIVE_SETTINGS,
        help="remove this setting's override (the file's holds again); repeat for several",
    )
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    text = "remove every run-time override of a queue: its file settings hold again"
    p = queues_sub.add_parser("reset", help=text, description=text)
    p.add_argument("name", help="queue name (see `dispatcher queues`)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS)


def queue_settings_change(args: argparse.Namespace) -> dict[str, Any]:
    """The change `queues set` asks for, as the API's PATCH body."""
    from dispatcher.operator.queue_limits import LIVE_SETTINGS

    change: dict[str, Any] = {key: None for key in args.unset}
    for key in LIVE_SETTINGS:
        value = getattr(args, key, None)
        if value is not None:
            change[key] = value
    if args.no_windows:
        change["windows"] = []
    return change


def dead_letter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", help="dead jobs of this queue")
    p.add_argument("--reason", dest="dead_reason", help="dead reason, e.g. http_4xx")
    p.add_argument("--tenant", help="dead jobs of this tenant")
    p.add_argument("--since", dest="dead_since", metavar="T", help="died at or after T (RFC 3339)")
    p.add_argument("--before", dest="dead_before", metavar="T", help="died before T (RFC 3339)")
    p.add_argument("--limit", type=bounded_int(1, 10_000_000), help="move at most this many")
    p.add_argument("--all", action="store_true", help="every dead job (needed without a filter)")
    p.add_argument("--dry-run", action="store_true", help="count the matching jobs; change nothing")
    p.add_argument("--json", action="store_true")


def main(argv: list[str] | None = None) -> int:
    """The command line; a reader that closes stdout early (`| head`) ends it quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the try: a closed pipe shows at the last flush too
    except BrokenPipeError:
        # stdout's buffer still holds bytes for the closed pipe; pointing fd 1 at /dev/null
        # keeps the interpreter's final flush from printing a second error at exit
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config)
    except DispatcherError as exc:
        for problem in str(exc).splitlines():  # one line per bad setting, greppable in a journal
            print(f"dispatcher: configuration error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_level, settings.log_format)
    if args.command in ("run", "check-config"):
        from dispatcher.effects.http import verify_dead_letter_targets
        from dispatcher.effects.python import verify_handlers

        try:
            verify_handlers(settings)
            verify_dead_letter_targets(settings)
        except DispatcherError as exc:
            print(f"dispatcher: configuration error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    handler = COMMANDS[args.command]
    try:
        return handler(settings, args)
    except DispatcherError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.daemon import Daemon
    from dispatcher.observability import tracing

    try:  # the standard OTEL_* variables; off unless they ask for an exporter
        traced = tracing.from_environment()
    except DispatcherError as exc:
        print(f"dispatcher: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import uvloop

        runner: Callable[[Awaitable[int]], int] = uvloop.run  # type: ignore[assignment]
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back if unavailable
        runner = asyncio.run  # type: ignore[assignment]

    async def run() -> int:
        return await Daemon(settings, traced).run()

    return runner(run())


@asynccontextmanager
async def database(
    settings: Settings, *, check_schema: bool = True, create: bool = False
) -> AsyncIterator[Any]:
    """A pool on the configured or embedded database, for one-shot commands. Only `create=True`
    (migrate, restore) may create an embedded database; the others refuse, naming where they
    looked, so a command run from the wrong directory never leaves an empty database behind."""
    from contextlib import AsyncExitStack

    from dispatcher.daemon import resolve_database
    from dispatcher.db import migrations
    from dispatcher.db.pool import create_pool, wait_for_database
    from dispatcher.errors import SchemaMismatch

    async with AsyncExitStack() as stack:
        dsn = await resolve_database(settings, stack, role="command", create=create)
        await wait_for_database(dsn, timeout_s=15)
        pool = await create_pool(dsn, size=2, application_name="dispatcher-cli")
        stack.push_async_callback(pool.close)
        if check_schema:
            async with pool.acquire() as conn:
                try:
                    await migrations.check_current(conn)
                except SchemaMismatch as exc:
                    raise SchemaMismatch(f"{database_place(settings)}: {exc}") from None
        yield dsn, pool


def database_place(settings: Settings) -> str:
    """Where a command looked for the database, as the error about it says it."""
    from dispatcher.config.settings import mask_url

    if settings.database_url is not None:
        return f"the database at {mask_url(settings.database_url.get_secret_value())}"
    return f"the embedded database in {settings.state_dir.absolute()}"


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db import migrations

    async def run() -> int:
        async with (
            database(settings, check_schema=False, create=True) as (_dsn, pool),
            pool.acquire() as conn,
        ):
            applied = await migrations.migrate(conn, wait_s=settings.database_wait_s)
        print("applied: " + ", ".join(applied) if applied else "schema is current")
        return 0

    return asyncio.run(run())


def cmd_check_config(settings: Settings, args: argparse.Namespace) -> int:
    print(json.dumps(settings.public_view(), indent=2, default=str))
    return 0


def cmd_db_url(settings: Settings, args: argparse.Namespace) -> int:
    """The URL alone on stdout (`psql "$(dispatcher db-url)"`); the advice on stderr."""
    import shlex

    from dispatcher.config.settings import mask_url
    from dispatcher.db.embedded import connection_url

    if settings.database_url is not None:
        print(mask_url(settings.database_url.get_secret_value()))
        print(
            "dispatcher: an external PostgreSQL (database_url; password masked): connect with "
            'the URL you configured, e.g. psql "$DISPATCHER_DATABASE_URL"',
            file=sys.stderr,
        )
        return 0
    url, running = connection_url(settings.state_dir)
    print(url)
    psql = client_bin_dir(settings) / "psql"
    print(
        f"connect with: {shlex.quote(str(psql)) if psql.exists() else 'psql'} {shlex.quote(url)}",
        file=sys.stderr,
    )
    if not running:
        print(
            f"dispatcher: the embedded PostgreSQL in {settings.state_dir.absolute()} is not "
            "running: it runs while `dispatcher run` does; start the daemon, then connect",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return 0


def cmd_jobs(settings: Settings, args: argparse.Namespace) -> int:
    if args.action in ("discard", "redrive", "reschedule"):
        return cmd_jobs_operate(settings, args)
    from dispatcher.api.app import attempt_view, job_view, summary_view
    from dispatcher.api.filters import FILTERS, FilterError, parse_job_filter
    from dispatcher.db.jobs import JobRepository

    if args.action == "list":  # checked before any database is opened
        try:
            filters = parse_job_filter({name: getattr(args, name) for name in FILTERS})
        except FilterError as exc:
            name, _, reason = str(exc).partition(": ")  # "due_before: ..." -> --due-before
            print(f"dispatcher: --{name.replace('_', '-')}: {reason}", file=sys.stderr)
            return EXIT_USAGE

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            repo = JobRepository(pool)
            if args.action == "list":
                rows = await repo.list_summaries(filters, cursor=None, limit=args.limit)
                print_jobs([summary_view(r) for r in rows], as_json=args.json)
                return 0
            operation = {"show": repo.get, "retry": repo.retry, "cancel": repo.cancel}[args.action]
            row = await operation(args.id)
            if row is None:
                current = await repo.get(args.id)
                if current is None:
                    print(f"dispatcher: no job {args.id}", file=sys.stderr)
                else:
                    print(
                        f"dispatcher: job {args.id} is {current['state']}; cannot {args.action}",
                        file=sys.stderr,
                    )
                return EXIT_FAILURE
            view = job_view(row)
            if args.action == "show" and args.attempts:
                history = await repo.attempts(args.id, limit=args.attempts)
                view["attempts"] = [attempt_view(a) for a in history]
            print(json.dumps(view, indent=2) if args.json else format_job(view))
            return 0

    return asyncio.run(run())


def cmd_jobs_operate(settings: Settings, args: argparse.Namespace) -> int:
    """`jobs discard [ID]`, `jobs redrive` and `jobs reschedule ID --at`: the checks and the
    operations of the HTTP API (dispatcher.operator.operations), straight on the database."""
    from pydantic import BaseModel, ValidationError

    from dispatcher.api.schemas import RescheduleRequest
    from dispatcher.intake.requests import DeadLetterRequest

    request: BaseModel | None = None  # None: `discard ID`, one job, no filters
    try:
        if args.action == "reschedule":
            request = RescheduleRequest.model_validate({"due_at": args.at})
        elif args.action == "discard" and args.id is not None:
            if any(getattr(args, name) for name in (*DEAD_LETTER_OPTIONS, "limit", "all")):
                print("dispatcher: give a job ID or filters, not both", file=sys.stderr)
                return EXIT_USAGE
        else:
            given = {k: getattr(args, k) for k in (*DEAD_LETTER_OPTIONS, "limit", "dry_run")}
            given["all"] = args.all
            request = DeadLetterRequest.model_validate(
                {k: v for k, v in given.items() if v is not None}
            )
    except ValidationError as exc:
        for error in exc.errors():
            field = ".".join(str(p) for p in error["loc"])
            option = OPTION_NAMES.get(field, "--at" if args.action == "reschedule" else field)
            message = cli_spelling(error["msg"].removeprefix("Value error, "))
            print(
                f"dispatcher: {option}: {message}" if field else f"dispatcher: {message}",
                file=sys.stderr,
            )
        return EXIT_USAGE
    return asyncio.run(_operate(settings, args, request))


# the CLI spelling of the bulk filters (DeadLetterRequest fields)
DEAD_LETTER_OPTIONS = ("queue", "dead_reason", "tenant", "dead_since", "dead_before")
OPTION_NAMES = {
    "queue": "--queue",
    "dead_reason": "--reason",
    "tenant": "--tenant",
    "dead_since": "--since",
    "dead_before": "--before",
    "limit": "--limit",
}


def cli_spelling(message: str) -> str:
    """A refusal written for the API (`dead_since`, `"all": true`) in the CLI's own words
    (`--since`, `--all`): the fix a user reads must be one they can type here."""
    import re

    message = message.replace('send "all": true', "pass --all").replace('"all": true', "--all")
    return re.sub(
        r"\b(" + "|".join(OPTION_NAMES) + r")\b", lambda m: OPTION_NAMES[m.group(1)], message
    )


async def _operate(settings: Settings, args: argparse.Namespace, request: Any) -> int:
    from datetime import UTC

    from dispatcher.api.app import job_view
    from dispatcher.db.jobs import JobRepository
    from dispatcher.operator.operations import long_past, move_dead_letters, unknown_queue

    async with database(settings) as (_dsn, pool):
        repo = JobRepository(pool)
        if args.action == "reschedule":
            due = request.due_at
            why = due and long_past(due, datetime.now(UTC), settings.due_at_past_tolerance_s)
            if why:
                print(f"dispatcher: --at: {why.removeprefix('due_at: ')}", file=sys.stderr)
                return EXIT_USAGE
            outcome = await repo.reschedule(args.id, due)
            refusal = "only scheduled or ready jobs can be rescheduled"
        elif getattr(args, "id", None) is not None:  # `discard ID` (redrive has no ID)
            outcome = await repo.discard(args.id)
            if outcome is None:
                current = await repo.get(args.id)
                outcome = None if current is None else str(current["state"])
            refusal = "only dead jobs can be discarded"
        else:
            if request.queue is not None and (why := await unknown_queue(repo, request.queue)):
                print(f"dispatcher: --queue: {why}", file=sys.stderr)
                return EXIT_USAGE
            result = await move_dead_letters(repo, args.action, request)
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                verb = "would move" if result["dry_run"] else "moved"
                target = "ready" if args.action == "redrive" else "discarded"
                print(f"{args.action}: {verb} {result['count']} dead job(s) to {target}")
            return 0
    if outcome is None:
        print(f"dispatcher: no job {args.id}", file=sys.stderr)
        return EXIT_FAILURE
    if isinstance(outcome, str):
        print(f"dispatcher: job {args.id} is {outcome}; {refusal}", file=sys.stderr)
        return EXIT_FAILURE
    view = job_view(outcome)
    print(json.dumps(view, indent=2) if args.json else format_job(view))
    return 0


def cmd_queues(settings: Settings, args: argparse.Namespace) -> int:
    import re

    from dispatcher.config.settings import NAME_PATTERN
    from dispatcher.db.jobs import JobRepository
    from dispatcher.db.queue_limits import QueueSettingsRepository
    from dispatcher.engine.sampler import MetricsSampler
    from dispatcher.operator.operations import queue_overview
    from dispatcher.operator.queue_limits import SettingsChangeError, validate_change

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            repo = JobRepository(pool)
            store = QueueSettingsRepository(pool)
            if args.action in ("set", "reset"):
                queue_names = [q["name"] for q in await repo.list_queues()]
                if args.name not in queue_names:
                    print(
                        f"dispatcher: no queue {args.name!r}; queues: {', '.join(queue_names)}",
                        file=sys.stderr,
                    )
                    return EXIT_FAILURE
                try:
                    current = {row.name: row for row in await store.all()}.get(args.name)
                    change = (
                        None
                        if args.action == "reset"
                        else validate_change(queue_settings_change(args), current)
                    )
                except SettingsChangeError as exc:
                    option = "--" + exc.field.split(".")[0].replace("_", "-")
                    print(f"dispatcher: {option}: {exc}; nothing changed", file=sys.stderr)
                    return EXIT_USAGE
                if change is None:
                    await store.reset_overrides(args.name)
                else:
                    await store.set_overrides(args.name, change)
                registry = [q for q in await repo.list_queues() if q["name"] == args.name]
            elif args.action in ("pause", "resume"):
                known = re.match(NAME_PATTERN, args.name) is not None
                row = (
                    await repo.set_queue_paused(args.name, args.action == "pause")
                    if known
                    else None
                )
                if row is None:
                    names = ", ".join(q["name"] for q in await repo.list_queues())
                    print(f"dispatcher: no queue {args.name!r}; queues: {names}", file=sys.stderr)
                    return EXIT_FAILURE
                registry = [row]
            else:
                registry = await repo.list_queues()
            sample = await MetricsSampler(repo, settings.overdue_after_s).sample()
            live = {row.name: row for row in await store.all()}
            views = queue_overview(registry, sample, settings, live)
        if args.action is not None:
            view = views[0]
            if args.json:
                print(json.dumps(view, indent=2))
            elif args.action in ("set", "reset"):
                print(f"queue {view['name']}: settings {args.action}\n" + format_settings(view))
            else:
                print(
                    f"queue {view['name']} {'paused' if view['paused'] else 'resumed'}"
                    f" ({view['jobs']['ready']} ready)"
                )
            return 0
        if args.json:
            print(json.dumps({"queues": views}, indent=2))
        else:
            print(format_queues(views))
        return 0

    return asyncio.run(run())


def format_queues(views: list[dict[str, Any]]) -> str:
    header = f"{'QUEUE':<16} {'PAUSED':<7}" + "".join(f"{s.upper():>11}" for s in STATES)
    lines = [header + f"{'OLDEST READY':>14}{'OVERDUE':>9}  LIMITS"]
    for v in views:
        cells = "".join(f"{v['jobs'][s]:>11}" for s in STATES)
        limits = v["limits"]
        rate = (
            f"rate {limits['rate_per_s']:g}/s burst {limits['burst']} inflight "
            f"{limits['max_inflight']}"
            if v["configured_here"]
            else "(not configured here)"
        )
        paused = "yes" if v["paused"] else "no"
        lines.append(
            f"{v['name']:<16} {paused:<7}{cells}{v['oldest_ready_age_s']:>13.1f}s"
            f"{v['overdue']:>9}  {rate}, attempts {limits['max_attempts']}"
        )
        if v["paused"]:
            lines.append(f"{'':<16} paused since {v['paused_at']}")
        if not v.get("window_open", True):
            lines.append(f"{'':<16} outside its run windows; opens at {v['window_opens_at']}")
        overrides = [
            f"{k} {x['value']} (file {x['file']})"
            for k, x in v.get("settings", {}).items()
            if x["source"] == "override"
        ]
        if overrides:
            lines.append(f"{'':<16} run-time overrides: {', '.join(overrides)}")
    return "\n".join(lines)


def format_settings(view: dict[str, Any]) -> str:
    """Each live setting of a queue view with its source, and the run-window state."""
    lines = []
    for key, entry in view.get("settings", {}).items():
        if entry["source"] is None:
            continue
        beside = f" (file: {entry['file']})" if entry["source"] == "override" else ""
        lines.append(f"  {key:<18} {entry['value']}  [{entry['source']}]{beside}")
    if view.get("window_open", True):
        lines.append("  window             open")
    else:
        lines.append(f"  window             closed; opens at {view['window_opens_at']}")
    return "\n".join(lines)


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.jobs import JobRepository
    from dispatcher.db.vacuum import vacuum_problems
    from dispatcher.model import STATES

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            repo = JobRepository(pool)
            counts = await repo.counts_by_state()
            ages = await repo.oldest_ready_age()
            overdue = await repo.count_overdue(settings.overdue_after_s)
            async with pool.acquire() as conn:
                warnings = await vacuum_problems(conn)
        queues: dict[str, dict[str, Any]] = {}
        for queue in sorted({q for q, _, _ in counts} | set(settings.queues)):
            queues[queue] = {state: 0 for state in STATES}
            queues[queue]["oldest_ready_age_s"] = round(ages.get(queue, 0.0), 3)
            queues[queue]["overdue"] = overdue.get(queue, 0)
        for queue, state, n in counts:
            queues[queue][state] = n
        if args.json:
            print(json.dumps({"queues": queues, "warnings": warnings}, indent=2))
            return 0
        header = f"{'QUEUE':<16}" + "".join(f"{s.upper():>11}" for s in STATES)
        print(header + f"{'OLDEST READY':>14}{'OVERDUE':>9}")
        for queue, row in queues.items():
            cells = "".join(f"{row[s]:>11}" for s in STATES)
            print(f"{queue:<16}{cells}{row['oldest_ready_age_s']:>13.1f}s{row['overdue']:>9}")
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return 0

    return asyncio.run(run())


def cmd_schedules(settings: Settings, args: argparse.Namespace) -> int:
    async def run(service: Any) -> int:
        action = getattr(args, "schedule_action", None)
        if action is not None:
            entry = await getattr(service, action)(args.name)
            print(
                json.dumps(entry, indent=2, default=_plain) if args.json else format_schedule(entry)
            )
            return 0
        status = await service.status()
        if args.json:
            print(json.dumps({"schedules": status}, indent=2, default=_plain))
            return 0
        if not status:
            print("no schedules configured ([[schedules]] in the configuration file)")
        for entry in status:
            print(format_schedule(entry))
        return 0

    return with_cron(settings, run)


def cmd_catch_up(settings: Settings, args: argparse.Namespace) -> int:
    start, end = parse_time(args.start, "--from"), parse_time(args.end, "--to")

    async def run(service: Any) -> int:
        if args.dry_run:
            planned = [p.to_json() for p in await service.plan_catch_up(args.schedule, start, end)]
            if args.json:
                print(json.dumps(planned, indent=2))
                return 0
            for v in planned:
                units = "" if v["units"] is None else f" units={v['units']}"
                print(f"{v['run_key']}  {v['outcome']:<12}{units}")
            would = sum(1 for v in planned if v["outcome"] == "would_create")
            print(f"dry run: {would} run(s) would be created, {len(planned) - would} exist")
            return 0
        receipts = await service.catch_up(args.schedule, start, end)
        views = [r.to_json() for r in receipts]
        if args.json:
            print(json.dumps(views, indent=2))
        else:
            for v in views:
                print(f"{v['run_key']}  {v['outcome']:<9} units={v['units']['total']}")
            created = sum(1 for v in views if v["outcome"] == "created")
            print(f"{created} run(s) created, {len(views) - created} already existed")
        return 0

    return with_cron(settings, run)


def client_bin_dir(settings: Settings) -> Path:
    from dispatcher.db.embedded import default_bin_dir

    return settings.embedded_postgres_bin or default_bin_dir()


def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.backup import BackupRepository, dump

    file = Path(args.file)
    if file.exists() and not args.force:
        print(f"dispatcher: {file} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_USAGE
    if not file.absolute().parent.is_dir():
        print(f"dispatcher: {file.absolute().parent} is not a directory", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        async with database(settings, check_schema=False) as (dsn, pool):
            await refuse_while_restoring(pool)
            if not await BackupRepository(pool).schema_exists():
                print(
                    "dispatcher: this database has no dispatcher schema to back up "
                    "(run dispatcher migrate or the daemon first)",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            size = await asyncio.to_thread(dump, dsn, file, client_bin_dir(settings))
        print(f"backed up the dispatcher schema to {file} ({size} bytes)")
        return 0

    return asyncio.run(run())


async def refuse_while_restoring(pool: Any) -> None:
    """A backup or a second restore while a restore loads: say so (SchemaBusy), in one line."""
    from dispatcher.db import migrations
    from dispatcher.errors import SchemaBusy

    async with pool.acquire() as conn:
        holder = await migrations.lock_holder(conn)
    if holder is not None:
        raise SchemaBusy(f"{holder}; try again once it has finished")


def cmd_restore(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.backup import BackupRepository, check_archive, restore

    file = Path(args.file)
    check_archive(file, client_bin_dir(settings))  # a wrong file changes nothing

    async def run() -> int:
        async with database(settings, check_schema=False, create=True) as (dsn, pool):
            await refuse_while_restoring(pool)
            repo = BackupRepository(pool)
            if await repo.daemon_sessions():
                print(
                    "dispatcher: a daemon is connected to this database; stop every "
                    "dispatcher run on it, then restore",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            if await repo.schema_exists() and not args.force:
                print(
                    "dispatcher: this database already has a dispatcher schema; restore into "
                    "an empty one (a new state directory), or pass --force to replace it",
                    file=sys.stderr,
                )
                return EXIT_FAILURE
            bin_dir = client_bin_dir(settings)
            version = await repo.server_version()
            await asyncio.to_thread(
                restore, dsn, file, bin_dir, server_version=version, replace=args.force
            )
            contents = await repo.contents()
        print(f"restored {file}: {contents.jobs} jobs, {contents.runs} run receipts")
        return 0

    return asyncio.run(run())


def cmd_console(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher.db.sessions import SessionRepository

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            return await console_admin.sessions_command(SessionRepository(pool), args)

    return asyncio.run(run())


def with_cron(settings: Settings, body: Callable[[Any], Awaitable[int]]) -> int:
    from dispatcher.cron.service import CronService
    from dispatcher.db.jobs import JobRepository

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            service = CronService(pool, JobRepository(pool), settings.schedules)
            try:
                return await body(service)
            except (LookupError, ValueError) as exc:
                print(f"dispatcher: {exc}", file=sys.stderr)
                return EXIT_USAGE

    return asyncio.run(run())


def parse_time(value: str, option: str) -> datetime:
    try:
        return rfc3339.parse(value)
    except rfc3339.TimeError as exc:
        raise SystemExit(f"dispatcher: {option}: {exc}") from None


def format_schedule(entry: dict[str, Any]) -> str:
    lines = [
        f"{entry.get('name')}  cron={entry.get('cron')!r} tz={entry.get('timezone')} "
        f"enabled={entry.get('enabled')} next={entry.get('next_fire_at')}"
    ]
    if entry.get("paused"):
        lines.append(
            f"  PAUSED since {entry.get('paused_at')} (resume: dispatcher schedules resume "
            f"{entry.get('name')})"
        )
    last = entry.get("last_run")
    if last:
        u = last["units"]
        lines.append(
            f"  last run {last['run_key']}: {u['succeeded']} done, {u['dead']} dead, "
            f"{u.get('discarded', 0)} discarded, {u['cancelled']} cancelled, "
            f"{u['pending']} pending of {u['total']} ({last['overlap_decision']})"
        )
    else:
        lines.append("  no run yet")
    missed = entry.get("missed") or {}
    if missed.get("count"):
        lines.append(f"  MISSED {missed['count']} period(s); catch up with: {missed['catch_up']}")
    return "\n".join(lines)


def print_jobs(views: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(views, indent=2))
        return
    # at least the usual widths, wider when a row needs it: due times print with the precision
    # they were given (seconds, milliseconds, microseconds), so no fixed width lines them all up
    width = {
        name: max([least, *(len(str(v[name])) for v in views)])
        for name, least in (("id", 8), ("queue", 12), ("due_at", 25))
    }
    id_w, queue_w, due_w = width["id"], width["queue"], width["due_at"]
    print(
        f"{'ID':>{id_w}}  {'STATE':<10} {'QUEUE':<{queue_w}} {'ATTEMPT':>7}  {'DUE':<{due_w}} KEY"
    )
    for v in views:
        print(
            f"{v['id']:>{id_w}}  {v['state']:<10} {v['queue']:<{queue_w}} {v['attempt']:>7}  "
            f"{v['due_at']:<{due_w}} {v['key']}"
        )
        if v["state"] == "dead" and v["last_error"]:
            print(f"{'':>{id_w + 2}}{v['dead_reason']}: {v['last_error'][:100]}")


def format_job(view: dict[str, Any]) -> str:
    fields = {k: v for k, v in view.items() if k != "attempts"}
    width = max(len(k) for k in fields)
    text = "\n".join(f"{k:<{width}}  {_plain(v)}" for k, v in fields.items())
    if "attempts" in view:
        text += "\n" + format_attempts(view["attempts"])
    return text


def format_attempts(attempts: list[dict[str, Any]]) -> str:
    """A job's attempt history, newest first, one line each (the excerpt cut to 100)."""
    if not attempts:
        return "no attempt has ended yet"
    lines = [
        f"attempts, newest first:\n{'#':>5}  {'OUTCOME':<13} {'FINISHED':<32} {'HTTP':>4} "
        f"{'LATENCY':>11}  REASON: EXCERPT"
    ]
    for a in attempts:
        latency = "-" if a["latency_s"] is None else f"{a['latency_s'] * 1000:.1f} ms"
        excerpt = " ".join((a["excerpt"] or "").split())[:100]
        detail = ": ".join(part for part in (a["reason"], excerpt) if part) or "-"
        lines.append(
            f"{a['attempt']:>5}  {a['outcome']:<13} {a['finished_at']:<32} "
            f"{_plain(a['http_status']):>4} {latency:>11}  {detail}"
        )
    return "\n".join(lines)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, datetime):
        return rfc3339.format(value)
    return str(value)


def cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    from dispatcher import share

    print("\n".join(share.shipped()) if args.list else share.example(args.name), end="")
    if args.list:
        print()
    return 0


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "run": cmd_run,
    "migrate": cmd_migrate,
    "config": cmd_config,
    "check-config": cmd_check_config,
    "db-url": cmd_db_url,
    "jobs": cmd_jobs,
    "status": cmd_status,
    "queues": cmd_queues,
    "schedules": cmd_schedules,
    "catch-up": cmd_catch_up,
    "backup": cmd_backup,
    "restore": cmd_restore,
    "console": cmd_console,
}

if __name__ == "__main__":
    sys.exit(main())
