"""The `dispatcher` command line's parser: every command, its options and their help (the
reference page docs/reference/cli.md is generated from it by tools/gendocs.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dispatcher import __version__
from dispatcher.config import secret_rotation
from dispatcher.console import admin as console_admin
from dispatcher.model import STATES

DESCRIPTION = """\
A durable delayed-job dispatcher for PostgreSQL. Jobs arrive over HTTP (POST /v1/jobs), from the
SQL function dispatcher.enqueue(...) inside your own transaction, or from cron schedules; each is
delivered at least once to an HTTPS target, a configured SQL statement or a Python handler, within
per-queue rate and concurrency limits.

Without DISPATCHER_DATABASE_URL the daemon runs its own PostgreSQL in DISPATCHER_STATE_DIR
(default ./var). Every setting comes from --config FILE (TOML) and DISPATCHER_* variables."""


JOB_ID_MAX = 2**63 - 1  # bigint
CONFIG_HELP = "TOML configuration file (default: $DISPATCHER_CONFIG, else built-in)"
# makes a command's parser (with --config) under the top-level subparsers
Command = Callable[[str, str], argparse.ArgumentParser]


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

    _daemon_commands(command)
    _schedule_commands(command)
    _backup_commands(command)
    _job_commands(command)
    accept_config_after_actions(parser)
    return parser


def _daemon_commands(command: Command) -> None:
    """`run`, `migrate`, `config`, `check-config`, `db-url`."""
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


def _schedule_commands(command: Command) -> None:
    """`status`, `schedules` (pause, resume, trigger) and `catch-up`."""
    status = command("status", "jobs per queue and state, oldest ready age, dead letters")
    status.add_argument("--json", action="store_true", help="one JSON document for scripts")

    schedules = command(
        "schedules",
        "schedules: next fire, last run receipt, missed periods; pause, resume, trigger",
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
    trigger_help = (
        "create the run of one period of a schedule (idempotent; works while paused, as an "
        "explicit request)"
    )
    trigger = schedule_actions.add_parser("trigger", help=trigger_help, description=trigger_help)
    trigger.add_argument("name", help="schedule name from [[schedules]]")
    trigger.add_argument(
        "--period", required=True, metavar="T", help="the period's start, RFC 3339"
    )
    trigger.add_argument(
        "--dry-run", action="store_true", help="say whether it would create the run; create nothing"
    )
    trigger.add_argument("--json", action="store_true", help="one JSON document for scripts")
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


def _backup_commands(command: Command) -> None:
    """`backup`, `restore` and `console` (its sessions)."""
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
    secret_rotation.add_command(
        command("signing-secret", "webhook signing secrets: list them, rotate the primary")
    )
    restore.add_argument(
        "--force", action="store_true", help="drop the existing dispatcher schema and replace it"
    )


def _job_commands(command: Command) -> None:
    """`jobs list|show|retry|cancel`, then the operator verbs of `add_operator_commands`."""
    jobs = command("jobs", "inspect and operate jobs (works whether the daemon runs or not)")
    jobs_sub = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = jobs_sub.add_parser("list", help="list jobs, newest first")
    job_filter_options(listing)
    listing.add_argument(
        "--limit", type=bounded_int(1, 1000), default=50, help="1 to 1000 (default 50)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON document for scripts")
    listing.add_argument(
        "--cursor",
        metavar="C",
        help="where the previous listing said to go on (the next page, or older jobs)",
    )
    for action, help_text in (
        ("show", "show one job and its attempt history"),
        ("retry", "retry a dead or cancelled job with a new attempt budget"),
        ("cancel", "cancel a waiting job (a running one is not retried)"),
        ("run-now", "run a scheduled job now, ahead of its due time"),
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
    bulk_command(jobs_sub)


def job_filter_options(p: argparse.ArgumentParser) -> None:
    """The job list's filters (GET /v1/jobs), for `jobs list` and `jobs bulk`."""
    p.add_argument("--state", choices=STATES)
    p.add_argument("--queue")
    p.add_argument("--key", help="the job with this idempotency key (exact)")
    p.add_argument("--tenant", help="jobs of this tenant")
    p.add_argument("--run-key", help="units of a cron run, e.g. nightly:2026-05-31T02:00:00Z")
    p.add_argument("--handler", help='"http" or a handler name from the configuration')
    p.add_argument("--priority", help="jobs of this priority (-100 to 100)")
    p.add_argument(
        "--reason", help="dead and discarded jobs with this dead reason (exact, as listed)"
    )
    p.add_argument("--key-prefix", metavar="TEXT", help="jobs whose key starts with TEXT")
    p.add_argument(
        "--error", metavar="TEXT", help="jobs whose last error contains TEXT (any case, 3+ chars)"
    )
    p.add_argument("--concurrency-key", help="jobs of this concurrency key (exact)")
    p.add_argument(
        "--due-before", metavar="T", help="due before T (exclusive), RFC 3339 with offset"
    )
    p.add_argument(
        "--due-after", metavar="T", help="due at or after T (inclusive), RFC 3339 with offset"
    )


def bulk_command(jobs_sub: Any) -> None:
    """`jobs bulk ACTION`: one action on many jobs, by --id or by the list's filters."""
    from dispatcher.operator.bulk import ACTIONS, BULK_BATCH, MAX_IDS

    text = (
        f"retry, cancel, discard, reschedule or run_now many jobs: --id (up to {MAX_IDS:,}) or "
        f"the filters of `jobs list` (--all for every job), in batches of {BULK_BATCH}; a job "
        "moves only from the states its one-job action accepts. Shows the dry run and asks "
        "first, unless --yes"
    )
    p = jobs_sub.add_parser("bulk", help=text, description=text)
    p.add_argument("bulk_action", choices=ACTIONS, metavar="ACTION", help=", ".join(ACTIONS))
    p.add_argument("--id", dest="ids", action="append", type=bounded_int(1, JOB_ID_MAX),
                   metavar="ID", help="a job; repeat for several")  # fmt: skip
    job_filter_options(p)
    p.add_argument("--all", action="store_true", help="every job (needed without a filter)")
    p.add_argument("--at", metavar="TIME|now", help='reschedule: RFC 3339 with offset, or "now"')
    p.add_argument("--dry-run", action="store_true", help="count per state; change nothing")
    p.add_argument("--yes", action="store_true", help="act without showing the dry run and asking")
    p.add_argument("--bulk-key", metavar="KEY", help="name the action: the same key resumes "
                   "one cut off, or answers a finished one without acting again")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON document for scripts")


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


def add_operator_commands(command: Command, jobs_sub: Any) -> None:
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
    key_help = (
        "give one concurrency key of a queue its own limits (persisted; every daemon's next "
        "claim honours them), or --reset it to the queue's key limits"
    )
    p = queues_sub.add_parser("key-limits", help=key_help, description=key_help)
    p.add_argument("name", help="queue name (see `dispatcher queues`)")
    p.add_argument(
        "key", help="the concurrency key (a job's concurrency_key; by default its tenant)"
    )
    p.add_argument("--max-inflight", type=bounded_int(1, 100_000), help="its jobs running at once")
    p.add_argument("--rate-per-s", type=float, help="its starts per second")
    p.add_argument("--burst", type=bounded_int(1, 2**31 - 1), help="its starts at once")
    p.add_argument("--reset", action="store_true", help="back to the queue's key limits")
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
        p.add_argument(f"--key-{option}", type=kind, help="for each concurrency key")
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
