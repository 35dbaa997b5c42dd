"""The console's bulk actions on the job list: the list's action bar sends the chosen action,
the rows ticked (or "all jobs matching this filter", with the list's filters) to a confirmation
page that runs the dry run (the count, what is skipped per state and why), and its form's POST
runs the same operator method as `POST /v1/jobs/bulk/{action}`, under a key made for that page
so a form sent twice acts once. Works without JavaScript; bulk.js only ticks a whole page."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from pydantic import ValidationError

from dispatcher.api.bulk import BulkBody, bulk_request
from dispatcher.api.filters import FILTERS
from dispatcher.api.problems import Problem
from dispatcher.api.schemas import describe, idempotency_key, is_ascii_number, summary
from dispatcher.console.actions import acting, confirm, done
from dispatcher.console.toolkit import PREFIX, operate
from dispatcher.operator.bulk import BulkRequest

# the action bar's choices: (the operator's action, the verb shown, what it does)
BULK_VERBS = {
    "retry": ("Retry", "back to ready now, each with a fresh attempt budget"),
    "cancel": ("Cancel", "no further attempt; running attempts are asked to stop"),
    "discard": ("Discard", "dead letters set aside (kept until the dead retention)"),
    "reschedule": ("Reschedule", "waiting jobs moved to the time given"),
    "run_now": ("Run now", "scheduled jobs made ready now"),
}
PAST = {
    "retry": "retried",
    "cancel": "cancelled",
    "discard": "discarded",
    "reschedule": "rescheduled",
    "run_now": "run now",
}


def read(values: Any, *, posted: bool) -> tuple[BulkRequest, dict[str, str]]:
    """The bulk request a form sends, and the fields that send it again (the confirmation
    page's hidden inputs). Ids come as ticked checkboxes (`id`, repeated) or, from the
    confirmation page, as one comma-separated `ids`."""
    action = str(values.get("action", ""))
    scope = str(values.get("scope", "selected"))
    given: dict[str, Any] = {}
    fields = {"action": action, "scope": scope}
    if scope == "selected":
        raw = str(values.get("ids", "")).split(",") if posted else values.getall("id", [])
        ids = [str(i).strip() for i in raw if str(i).strip()]
        if not ids:
            raise Problem(422, "Tick the jobs to act on, or choose all jobs matching the filter.")
        if not all(is_ascii_number(i, max_digits=18) for i in ids):
            raise Problem(422, "Job ids are positive integers.")
        given["ids"] = [int(i) for i in ids]
        fields["ids"] = ",".join(ids)
    elif scope == "matching":
        chosen = {name: str(values.get(name)) for name in FILTERS if values.get(name)}
        given["filter"] = chosen
        given["all"] = not chosen  # the operator chose "all matching" on an unfiltered list
        fields.update(chosen)
    else:
        raise Problem(422, "Choose the ticked jobs or all jobs matching the filter.")
    due = str(values.get("due_at", "")).strip()
    due_given = action == "reschedule" and bool(due)
    if due_given:
        given["due_at"] = due
        fields["due_at"] = due
    try:
        body = BulkBody.model_validate(given)
    except ValidationError as exc:
        raise Problem(422, summary(describe(exc))) from None
    # not `key`: that is the job list's filter by a job's idempotency key
    key = idempotency_key(str(values.get("bulk_key", ""))) if posted else None
    return bulk_request(action, body, due_given=due_given, key=key), fields


@operate
async def bulk_confirm(request: web.Request) -> web.StreamResponse:
    """The dry run of a bulk action on the list's selection, then its form."""
    bulk, fields = read(request.query, posted=False)
    operator, actor = acting(request)
    dry = await operator.bulk(actor, dataclasses.replace(bulk, dry_run=True))
    verb, effect = BULK_VERBS[bulk.action]
    would, matched = dry["would_apply"], dry["matched"]
    lines = [
        f"Dry run: {matched} job{_s(matched)} selected"
        + (" (at least: counting stopped there)" if dry["count_capped"] else "")
        + f", {would} can be {_past(bulk.action)}.",
        f"{verb}: {effect}.",
    ]
    lines += [
        f"Skipped: {v['count']} {state} ({v['reason']})." for state, v in dry["skipped"].items()
    ]
    if dry.get("not_found"):
        lines.append(f"Not found: {dry['not_found']} (pruned meanwhile).")
    lines.append("Jobs created after this page was shown are not taken.")
    return confirm(
        request,
        title=f"{verb} {would} job{_s(would)}?",
        lines=lines,
        action=f"{PREFIX}/jobs/bulk",
        button=f"{verb} {would} job{_s(would)}",
        back=f"{PREFIX}/jobs?{urlencode(_list_filters(fields))}",
        fields={**fields, "bulk_key": f"console-{uuid.uuid4().hex}"},
        count=would,
    )


@operate
async def bulk_act(request: web.Request) -> web.StreamResponse:
    bulk, fields = read(await request.post(), posted=True)
    operator, actor = acting(request)
    result = await operator.bulk(actor, bulk)
    verb, _ = BULK_VERBS[bulk.action]
    skipped = "; ".join(f"{v['count']} {s}" for s, v in result["skipped"].items())
    message = f"{verb}: {result['applied']} of {result['matched']} jobs {_past(bulk.action)}"
    message += f"; skipped {skipped}" if skipped else ""
    message += f"; {result['busy']} busy (ask again)" if result["busy"] else ""
    message += " (this form was sent before: nothing more done)" if result["replayed"] else ""
    link = f"{PREFIX}/jobs?{urlencode(_list_filters(fields))}"
    return done(request, message + ".", [(link, "Jobs")])


def _list_filters(fields: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in fields.items() if name in FILTERS}


def _past(action: str) -> str:
    return PAST[action]


def _s(n: int) -> str:
    return "" if n == 1 else "s"


ROUTES = [
    ("GET", "/jobs/bulk", bulk_confirm),
    ("POST", "/jobs/bulk", bulk_act),
]
