"""`dispatcher jobs bulk ACTION`: one action on many jobs, by `--id` or by the job list's
filters, read into the API's body (dispatcher.api.bulk) so the same input is refused the same
way, then run by the operator service as the OS user. Without `--yes` it shows the dry run and
asks first (and refuses to act when nobody can answer)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from pydantic import ValidationError

from dispatcher.api.bulk import BulkBody, bulk_request
from dispatcher.api.filters import FILTERS
from dispatcher.api.schemas import idempotency_key
from dispatcher.cli.common import EXIT_FAILURE, EXIT_USAGE, operate
from dispatcher.config.settings import Settings
from dispatcher.operator.audit import Actor
from dispatcher.operator.bulk import BulkRequest
from dispatcher.operator.service import Operator


def cmd_jobs_bulk(settings: Settings, args: argparse.Namespace) -> int:
    request = read_request(args)
    if request is None:
        return EXIT_USAGE

    async def run(operator: Operator) -> int:
        actor = Actor.cli()
        if args.dry_run or not args.yes:
            dry = await operator.bulk(actor, dataclasses.replace(request, dry_run=True))
            show(dry, args.json)
            if args.dry_run:
                return 0
            if not confirmed(dry):
                return EXIT_FAILURE
        show(await operator.bulk(actor, request), args.json)
        return 0

    return operate(settings, run)


def read_request(args: argparse.Namespace) -> BulkRequest | None:
    """The operator's request from the options; None after printing why it is refused.
    (Invalid from `bulk_request` reaches the command line's one refusal printer.)"""
    given: dict[str, Any] = {"dry_run": False}
    if args.ids:
        given["ids"] = args.ids
    chosen = {name: getattr(args, name) for name in FILTERS if getattr(args, name) is not None}
    if chosen:
        given["filter"] = chosen
    if args.all:
        given["all"] = True
    if args.at is not None:
        given["due_at"] = args.at
    key = args.bulk_key
    if key is not None and idempotency_key(key) is None:
        print("dispatcher: --bulk-key: 1 to 255 printable ASCII characters", file=sys.stderr)
        return None
    try:
        body = BulkBody.model_validate(given)
    except ValidationError as exc:
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            option = {"ids": "--id", "due_at": "--at"}.get(field, f"--{field}")
            print(f"dispatcher: {option}: {error['msg']}", file=sys.stderr)
        return None
    return bulk_request(args.bulk_action, body, due_given=args.at is not None, key=key)


def confirmed(dry: dict[str, Any]) -> bool:
    """Whether the operator, shown the dry run, says yes (never without a terminal)."""
    if not sys.stdin.isatty():
        print("dispatcher: nothing changed: add --yes to act without asking", file=sys.stderr)
        return False
    answer = input(f"{dry['action']} {dry['would_apply']} job(s)? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        print("nothing changed", file=sys.stderr)
        return False
    return True


def show(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    skipped = "; ".join(
        f"{state} {v['count']} ({v['reason']})" for state, v in result["skipped"].items()
    )
    if result["dry_run"]:
        line = (
            f"dry run {result['action']}: would apply {result['would_apply']} of "
            f"{result['matched']} matching"
        )
    else:
        became = ", ".join(f"{s} {n}" for s, n in sorted(result["became"].items()))
        line = f"{result['action']}: applied {result['applied']} of {result['matched']}"
        line += f" (now {became})" if became else ""
        line += f"; busy {result['busy']}" if result["busy"] else ""
    line += f"; skipped {skipped}" if skipped else ""
    line += f"; not found {result['not_found']}" if result.get("not_found") else ""
    if not result["dry_run"]:
        replayed = ", replayed: nothing more done" if result["replayed"] else ""
        line += f" [bulk key {result['bulk_id']}{replayed}]"
    print(line)
