"""The console's actions: for each, a GET that shows what will happen (with the dry-run count
where there is one) and a form, and the POST of that form, which runs the same method of the
operator service (dispatcher.operator.service) as the API route, as the session's token, and
shows the outcome. The service's refusals become error pages in the toolkit's middleware."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from pydantic import ValidationError

from dispatcher.api.keys import OPERATOR, REPO
from dispatcher.api.problems import Problem
from dispatcher.api.schemas import describe, is_ascii_number, summary
from dispatcher.console.toolkit import (
    PREFIX,
    api_of,
    base_context,
    operate,
    render,
    session_of,
)
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.operator.audit import Actor
from dispatcher.operator.bulk import TRANSITIONS
from dispatcher.operator.service import Operator

JOB_ACTIONS = {
    # the operator service's method: (verb shown, states it applies to, what it does)
    "retry": (
        "Retry",
        TRANSITIONS["retry"].states,
        "back to ready now, with a fresh attempt budget",
    ),
    "cancel": (
        "Cancel",
        TRANSITIONS["cancel"].states,
        "no further attempt; a running attempt is asked to stop",
    ),
    "discard": (
        "Discard",
        TRANSITIONS["discard"].states,
        "set the dead letter aside (kept visible until the dead retention)",
    ),
    "run_now": (
        "Run now",
        TRANSITIONS["run_now"].states,
        "ready at once, ahead of its due time",
    ),
}


BULK_ACTIONS = {
    "redrive": ("Redrive", "back to ready now, each with a fresh attempt budget"),
    "discard": ("Discard", "set aside (kept visible until the dead retention)"),
}


# overview ------------------------------------------------------------------------------------
def acting(request: web.Request) -> tuple[Operator, Actor]:
    """The operator service and who asks: the session's token (or the anonymous session)."""
    return api_of(request)[OPERATOR], Actor(session_of(request).name, "console")


def job_id(raw: str) -> int:
    if not is_ascii_number(raw, max_digits=18):
        raise Problem(404, "No such job: job ids are positive integers.")
    return int(raw)


def job_action_named(request: web.Request) -> tuple[int, str]:
    action = request.match_info["action"]
    if action not in JOB_ACTIONS:
        raise Problem(404, f"No action {action[:40]!r}; actions: {', '.join(JOB_ACTIONS)}.")
    return job_id(request.match_info["id"]), action


@operate
async def job_confirm(request: web.Request) -> web.StreamResponse:
    jid, action = job_action_named(request)
    job = await api_of(request)[REPO].get(jid)
    if job is None:
        raise Problem(404, f"No job {jid}.")
    verb, _, effect = JOB_ACTIONS[action]
    return confirm(
        request,
        title=f"{verb} job {jid}?",
        lines=[f"Job {jid} ({job['key']}) is {job['state']}.", f"{verb}: {effect}."],
        action=f"{PREFIX}/jobs/{jid}/{action}",
        button=f"{verb} job {jid}",
        back=f"{PREFIX}/jobs/{jid}",
    )


@operate
async def job_act(request: web.Request) -> web.StreamResponse:
    jid, action = job_action_named(request)
    operator, actor = acting(request)
    row = await getattr(operator, action)(actor, jid)  # JOB_ACTIONS: the service's methods
    return done(
        request, f"Job {jid} is now {row['state']}.", [(f"{PREFIX}/jobs/{jid}", f"Job {jid}")]
    )


# queues --------------------------------------------------------------------------------------
def queue_action_named(request: web.Request) -> tuple[str, str]:
    action = request.match_info["action"]
    if action not in ("pause", "resume"):
        raise Problem(404, "Queue actions are pause and resume.")
    return request.match_info["name"], action


@operate
async def queue_confirm(request: web.Request) -> web.StreamResponse:
    name, action = queue_action_named(request)
    await api_of(request)[OPERATOR].queue(name)
    effect = (
        "no daemon claims its jobs until it is resumed; intake and due times go on, and "
        "attempts already running finish"
        if action == "pause"
        else "every daemon starts claiming its ready jobs again"
    )
    return confirm_pause_or_resume(request, "queue", name, action, effect, back=f"{PREFIX}/")


def confirm_pause_or_resume(
    request: web.Request, kind: str, name: str, action: str, effect: str, *, back: str
) -> web.StreamResponse:
    """The confirmation page of pausing or resuming a queue or a schedule."""
    what = f"{action.capitalize()} {kind} {name}"
    return confirm(
        request,
        title=f"{what}?",
        lines=[f"{what}: {effect}."],
        action=f"{PREFIX}/{kind}s/{name}/{action}",
        button=what,
        back=back,
    )


@operate
async def queue_act(request: web.Request) -> web.StreamResponse:
    name, action = queue_action_named(request)
    operator, actor = acting(request)
    row = await operator.set_queue_paused(actor, name, paused=action == "pause")
    state = "paused" if row["paused"] else "active"
    return done(request, f"Queue {name} is {state}.", [(f"{PREFIX}/", "Overview")])


def bulk_request(
    request: web.Request, values: Any, *, dry_run: bool
) -> tuple[str, DeadLetterRequest]:
    action = request.match_info["action"]
    if action not in BULK_ACTIONS:
        raise Problem(404, "Dead-letter actions are redrive and discard.")
    chosen = {name: values.get(name) for name in ("queue", "dead_reason") if values.get(name)}
    if "queue" not in chosen:
        raise Problem(
            422, "Choose the dead letters by queue (and reason) from the dead-letter page."
        )
    try:
        body = DeadLetterRequest.model_validate({**chosen, "dry_run": dry_run})
    except ValidationError as exc:
        raise Problem(422, summary(describe(exc))) from None
    return action, body


@operate
async def dead_confirm(request: web.Request) -> web.StreamResponse:
    """The dry run of a bulk action, then its form: the count is what the POST would move."""
    action, body = bulk_request(request, request.query, dry_run=True)
    operator, actor = acting(request)
    result = await operator.move_dead_letters(actor, action, body)
    verb, effect = BULK_ACTIONS[action]
    what = f"queue {body.queue}" + (f", reason {body.dead_reason}" if body.dead_reason else "")
    count = result["count"]
    return confirm(
        request,
        title=f"{verb} dead letters?",
        lines=[
            f"Dry run: {count} dead job{'s' if count != 1 else ''} match ({what}).",
            f"{verb}: {effect}. Jobs that die after this page was shown are not taken.",
        ],
        action=f"{PREFIX}/dead/{action}",
        button=f"{verb} {count} dead job{'s' if count != 1 else ''}",
        back=f"{PREFIX}/dead",
        fields={"queue": body.queue or "", "dead_reason": body.dead_reason or ""},
        count=count,
    )


@operate
async def dead_act(request: web.Request) -> web.StreamResponse:
    action, body = bulk_request(request, await request.post(), dry_run=False)
    operator, actor = acting(request)
    result = await operator.move_dead_letters(actor, action, body)
    verb = {"redrive": "Redriven", "discard": "Discarded"}[action]
    return done(
        request, f"{verb}: {result['count']} dead jobs.", [(f"{PREFIX}/dead", "Dead letters")]
    )


def catch_up_range(values: Any) -> tuple[str, str]:
    return str(values.get("from")), str(values.get("to"))


@operate
async def catch_up_confirm(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    operator, actor = acting(request)
    start, end = catch_up_range(request.query)
    plan = await operator.catch_up(actor, name, start, end, dry_run=True)
    would = plan["would_create"]
    context = base_context(request, f"Catch up {name}?", "schedules")
    context.update(
        name=name,
        plan=plan,
        would=would,
        fields={"from": start.strip(), "to": end.strip()},
        action=f"{PREFIX}/schedules/{name}/catch-up",
        back=f"{PREFIX}/schedules",
    )
    return render(request, "catch_up.html", context)


@operate
async def catch_up_act(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    operator, actor = acting(request)
    start, end = catch_up_range(await request.post())
    result = await operator.catch_up(actor, name, start, end, dry_run=False)
    return done(
        request,
        f"Catch-up of {name}: {result['created']} runs created, {result['existing']} existed.",
        [(f"{PREFIX}/schedules", "Schedules")],
    )


@operate
async def trigger_confirm(request: web.Request) -> web.StreamResponse:
    """The dry run of triggering one period (by default the latest that has started: "trigger
    now"), then its form."""
    name = request.match_info["name"]
    operator, actor = acting(request)
    period = str(request.query.get("period_start", ""))
    plan = await operator.trigger(actor, name, period, dry_run=True)
    start = plan["period_start"]
    if plan["outcome"] == "existing":
        effect = f"the period {start} already has its run {plan['run_key']}; nothing new is created"
    else:
        units = "" if plan["units"] is None else f" with {plan['units']} units"
        effect = f"creates the run {plan['run_key']}{units}, ready now"
    return confirm(
        request,
        title=f"Trigger {name}?",
        lines=[f"Dry run: {effect}.", "Triggering a period again never runs it twice."],
        action=f"{PREFIX}/schedules/{name}/trigger",
        button=f"Trigger {name} for {start}",
        back=f"{PREFIX}/schedules",
        fields={"period_start": start},
    )


@operate
async def trigger_act(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    operator, actor = acting(request)
    period = str((await request.post()).get("period_start", ""))
    run = await operator.trigger(actor, name, period)
    return done(
        request,
        f"Trigger of {name} for {run['period_start']}: run {run['run_key']} {run['outcome']}.",
        [
            (f"{PREFIX}/schedules", "Schedules"),
            (f"{PREFIX}/jobs?{urlencode({'run_key': run['run_key']})}", "Its jobs"),
        ],
    )


def schedule_action_named(request: web.Request) -> tuple[str, str]:
    name, action = request.match_info["name"], request.match_info["action"]
    api_of(request)[OPERATOR].schedule(name)
    if action not in ("pause", "resume"):
        raise Problem(404, "Schedule actions are pause, resume, trigger and catch-up.")
    return name, action


@operate
async def schedule_confirm(request: web.Request) -> web.StreamResponse:
    name, action = schedule_action_named(request)
    effect = (
        "no instance fires it; its periods are recorded as missed (catch them up later)"
        if action == "pause"
        else "it fires again from its next period; missed periods stay listed"
    )
    return confirm_pause_or_resume(
        request, "schedule", name, action, effect, back=f"{PREFIX}/schedules"
    )


@operate
async def schedule_act(request: web.Request) -> web.StreamResponse:
    name, action = schedule_action_named(request)
    operator, actor = acting(request)
    await operator.set_schedule_paused(actor, name, paused=action == "pause")
    return done(request, f"Schedule {name}: {action}d.", [(f"{PREFIX}/schedules", "Schedules")])


# confirmation and outcome ---------------------------------------------------------------------
def confirm(
    request: web.Request,
    *,
    title: str,
    lines: list[str],
    action: str,
    button: str,
    back: str,
    fields: dict[str, str] | None = None,
    count: int | None = None,
) -> web.Response:
    context = base_context(request, title)
    context.update(
        lines=lines, action=action, button=button, back=back, fields=fields or {}, count=count
    )
    return render(request, "confirm.html", context)


def done(request: web.Request, message: str, links: list[tuple[str, str]]) -> web.Response:
    context = base_context(request, "Done")
    context.update(message=message, links=links, actor=session_of(request).name)
    return render(request, "done.html", context)
