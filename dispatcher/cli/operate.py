"""The commands that look at and operate jobs, queues and schedules: `jobs`, `queues`,
`schedules`, `catch-up`, `status`. Every action goes through the operator service
(dispatcher.operator.service) as the OS user, as the API and the console do; its refusals are
printed by `dispatcher.cli` (`common.refusal`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from dispatcher.cli.common import EXIT_USAGE, database, operate, plain
from dispatcher.cli.formats import (
    format_job,
    format_queues,
    format_schedule,
    format_settings,
    print_jobs,
)
from dispatcher.config.settings import Settings
from dispatcher.model import JobPage
from dispatcher.operator.audit import Actor
from dispatcher.operator.key_limits import KeyLimits
from dispatcher.operator.service import Operator

# the CLI spelling of the bulk filters (DeadLetterRequest fields)
DEAD_LETTER_OPTIONS = ("queue", "dead_reason", "tenant", "dead_since", "dead_before")


def cmd_jobs(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "bulk":
        from dispatcher.cli.bulk import cmd_jobs_bulk

        return cmd_jobs_bulk(settings, args)
    if args.action in ("discard", "redrive", "reschedule"):
        return cmd_jobs_operate(settings, args)
    if args.action in ("list", "show"):
        return cmd_jobs_read(settings, args)
    from dispatcher.api.views import job_view

    async def act(operator: Operator) -> int:  # `jobs VERB ID`: the service's method VERB
        action = getattr(operator, args.action.replace("-", "_"))
        view = job_view(await action(Actor.cli(), args.id))
        print(json.dumps(view, indent=2) if args.json else format_job(view))
        return 0

    return operate(settings, act)


def cmd_jobs_read(settings: Settings, args: argparse.Namespace) -> int:
    """`jobs list` and `jobs show`: reads, straight from the database."""
    from dispatcher.api.filters import (
        FILTERS,
        FilterError,
        page_cursor,
        parse_cursor,
        parse_job_filter,
    )
    from dispatcher.api.views import attempt_view, job_view, summary_view
    from dispatcher.db.jobs import JobRepository

    if args.action == "list":  # checked before any database is opened
        try:
            filters = parse_job_filter({name: getattr(args, name) for name in FILTERS})
            cursor = parse_cursor(args.cursor, filters)
        except FilterError as exc:
            name, _, reason = str(exc).partition(": ")  # "due_before: ..." -> --due-before
            print(f"dispatcher: --{name.replace('_', '-')}: {reason}", file=sys.stderr)
            return EXIT_USAGE

    async def run() -> int:
        async with database(settings) as (_dsn, pool):
            repo = JobRepository(pool)
            if args.action == "list":
                page = await repo.list_summaries(filters, cursor=cursor, limit=args.limit)
                print_jobs([summary_view(r) for r in page.rows], as_json=args.json)
                print_continuation(page, page_cursor(page, filters, args.limit))
                return 0
            row = await repo.get(args.id)
            if row is None:
                print(f"dispatcher: no job {args.id}", file=sys.stderr)
                return 1
            view = job_view(row)
            if args.attempts:
                history = await repo.attempts(args.id, limit=args.attempts)
                view["attempts"] = [attempt_view(a) for a in history]
        print(json.dumps(view, indent=2) if args.json else format_job(view))
        return 0

    return asyncio.run(run())


def print_continuation(page: JobPage, cursor: str | None) -> None:
    """On stderr (stdout stays the list, for scripts): how to go on, when there is more."""
    if page.searched is not None:
        low, high = page.searched.oldest, page.searched.newest
        print(
            f"dispatcher: many keys start with this prefix: searched the jobs {low} to {high} "
            f"only; to search older ones, add --cursor {cursor}",
            file=sys.stderr,
        )
    elif cursor is not None:
        print(f"dispatcher: more jobs match; next page: --cursor {cursor}", file=sys.stderr)


def cmd_jobs_operate(settings: Settings, args: argparse.Namespace) -> int:
    """`jobs discard [ID]`, `jobs redrive` and `jobs reschedule ID --at`: the request models of
    the API (so the same input is refused the same way), then the operator service."""
    from pydantic import BaseModel, ValidationError

    from dispatcher.api.schemas import RescheduleRequest
    from dispatcher.cli.common import OPTION_NAMES, cli_spelling
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
    return operate(settings, lambda operator: _operate(operator, args, request))


async def _operate(operator: Operator, args: argparse.Namespace, request: Any) -> int:
    from dispatcher.api.views import job_view

    actor = Actor.cli()
    if args.action == "reschedule":
        row = await operator.reschedule(actor, args.id, request.due_at)
    elif request is None:  # `discard ID` (redrive has no ID)
        row = await operator.discard(actor, args.id)
    else:
        result = await operator.move_dead_letters(actor, args.action, request)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            verb = "would move" if result["dry_run"] else "moved"
            target = "ready" if args.action == "redrive" else "discarded"
            print(f"{args.action}: {verb} {result['count']} dead job(s) to {target}")
        return 0
    view = job_view(row)
    print(json.dumps(view, indent=2) if args.json else format_job(view))
    return 0


def cmd_queues(settings: Settings, args: argparse.Namespace) -> int:
    async def run(operator: Operator) -> int:
        if args.action is None:
            views = await operator.queues(max_age_s=0.0)
            print(json.dumps({"queues": views}, indent=2) if args.json else format_queues(views))
            return 0
        if args.action == "key-limits":
            return await _key_limits(operator, args)
        if args.action in ("set", "reset"):
            change = queue_settings_change(args) if args.action == "set" else None
            view = await operator.change_queue_settings(Actor.cli(), args.name, change)
            done = f"queue {view['name']}: settings {args.action}\n" + format_settings(view)
            print(json.dumps(view, indent=2) if args.json else done)
            return 0
        paused = args.action == "pause"
        view = await operator.set_queue_paused(Actor.cli(), args.name, paused=paused)
        if args.json:
            print(json.dumps(view, indent=2))
        else:
            print(
                f"queue {view['name']} {'paused' if view['paused'] else 'resumed'}"
                f" ({view['jobs']['ready']} ready)"
            )
        return 0

    return operate(settings, run)


async def _key_limits(operator: Operator, args: argparse.Namespace) -> int:
    """`queues key-limits NAME KEY`: set one key's own limits, or --reset them."""
    if args.reset:
        result = await operator.clear_key_limits(Actor.cli(), args.name, args.key)
        said = "back on" if result["had_override"] else "already on"
        text = f"key {args.key} of queue {args.name}: {said} the queue's key limits"
    else:
        limits = KeyLimits(args.max_inflight, args.rate_per_s, args.burst)
        result = await operator.set_key_limits(Actor.cli(), args.name, args.key, limits)
        shown = ", ".join(
            f"{field} {result[field]}"
            for field in ("max_inflight", "rate_per_s", "burst")
            if result[field] is not None
        )
        text = f"key {args.key} of queue {args.name}: {shown}"
    print(json.dumps(result, indent=2) if getattr(args, "json", False) else text)
    return 0


def queue_settings_change(args: argparse.Namespace) -> dict[str, Any]:
    """The change `queues set` asks for, as the API's PATCH body (validated by the service)."""
    from dispatcher.operator.queue_limits import LIVE_SETTINGS

    change: dict[str, Any] = {key: None for key in args.unset}
    for key in LIVE_SETTINGS:
        value = getattr(args, key, None)
        if value is not None:
            change[key] = value
    if args.no_windows:
        change["windows"] = []
    return change


def cmd_schedules(settings: Settings, args: argparse.Namespace) -> int:
    async def run(operator: Operator) -> int:
        action = getattr(args, "schedule_action", None)
        if action == "trigger":
            receipt = await operator.trigger(
                Actor.cli(), args.name, args.period, dry_run=args.dry_run
            )
            line = f"{receipt['run_key']}  {receipt['outcome']}"
            print(json.dumps(receipt, indent=2, default=plain) if args.json else line)
            return 0
        if action is not None:
            paused = action == "pause"
            entry = await operator.set_schedule_paused(Actor.cli(), args.name, paused=paused)
            print(
                json.dumps(entry, indent=2, default=plain) if args.json else format_schedule(entry)
            )
            return 0
        status = await operator.schedule_status()
        if args.json:
            print(json.dumps({"schedules": status}, indent=2, default=plain))
            return 0
        if not status:
            print("no schedules configured ([[schedules]] in the configuration file)")
        for entry in status:
            print(format_schedule(entry))
        return 0

    return operate(settings, run)


def cmd_catch_up(settings: Settings, args: argparse.Namespace) -> int:
    async def run(operator: Operator) -> int:
        body = await operator.catch_up(
            Actor.cli(), args.schedule, args.start, args.end, dry_run=args.dry_run
        )
        views = body["runs"]
        if args.json:
            print(json.dumps(views, indent=2))
        elif args.dry_run:
            for v in views:
                units = "" if v["units"] is None else f" units={v['units']}"
                print(f"{v['run_key']}  {v['outcome']:<12}{units}")
            print(
                f"dry run: {body['would_create']} run(s) would be created, {body['existing']} exist"
            )
        else:
            for v in views:
                print(f"{v['run_key']}  {v['outcome']:<9} units={v['units']['total']}")
            print(f"{body['created']} run(s) created, {body['existing']} already existed")
        return 0

    return operate(settings, run)


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
