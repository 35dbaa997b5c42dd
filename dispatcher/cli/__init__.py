"""The `dispatcher` command: run the daemon, migrate, check the configuration, operate jobs.

The parser is dispatcher.cli.parser; the commands live in dispatcher.cli.system (the daemon
and its database) and dispatcher.cli.operate (jobs, queues, schedules: through the operator
service). A refusal of the operator service is printed here, once (`common.refusal`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from dispatcher.cli import operate, system
from dispatcher.cli.common import EXIT_BROKEN_PIPE, EXIT_FAILURE, EXIT_USAGE, refusal
from dispatcher.cli.parser import build_parser
from dispatcher.config import secret_rotation
from dispatcher.config.settings import Settings, load_settings
from dispatcher.errors import DispatcherError
from dispatcher.observability import logs
from dispatcher.operator.errors import OperatorError

__all__ = ["build_parser", "main"]

COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "run": system.cmd_run,
    "migrate": system.cmd_migrate,
    "config": system.cmd_config,
    "check-config": system.cmd_check_config,
    "db-url": system.cmd_db_url,
    "jobs": operate.cmd_jobs,
    "status": operate.cmd_status,
    "queues": operate.cmd_queues,
    "schedules": operate.cmd_schedules,
    "catch-up": operate.cmd_catch_up,
    "backup": system.cmd_backup,
    "restore": system.cmd_restore,
    "console": system.cmd_console,
    "signing-secret": secret_rotation.cmd_signing_secret,
}


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
    except OperatorError as exc:
        code, line = refusal(exc)
        print(line, file=sys.stderr)
        return code
    except DispatcherError as exc:
        print(f"dispatcher: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
