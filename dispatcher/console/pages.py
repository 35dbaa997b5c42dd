"""The console's pages: what each reads (bounded, index-backed queries only; see
tests/db/test_console_plans.py), and the console's routes (`ROUTES`, the actions' pages from
dispatcher.console.actions).

Reading pages need the `read` scope. Every action is two requests: a GET that shows what will
happen (with the dry-run count where there is one) and a form, and the POST of that form, which
runs the same method of the operator service (dispatcher.operator.service) as the API route,
as the session's token, and shows the outcome. The service's refusals are rendered as error
pages by the toolkit's middleware.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web

from dispatcher.api.filters import FILTERS, FilterError, page_cursor, parse_cursor, parse_job_filter
from dispatcher.api.jobs import LIST_PARAMETERS
from dispatcher.api.keys import OPERATOR, REPO
from dispatcher.api.problems import Problem
from dispatcher.api.schemas import is_ascii_number
from dispatcher.api.views import contract_view
from dispatcher.console import actions, bulk, charts
from dispatcher.console.actions import JOB_ACTIONS, job_id
from dispatcher.console.toolkit import (
    HISTORY,
    Route,
    api_of,
    base_context,
    render,
)
from dispatcher.core.redact import masked_target
from dispatcher.db.history import ALL_QUEUES
from dispatcher.db.job_reads import ERROR_SCAN_ROWS, PREFIX_SCAN_IDS
from dispatcher.db.runs import RunRepository
from dispatcher.model import STATES

PAGE_SIZES = (25, 50, 100)
ATTEMPTS_SHOWN = 50
# A job page loads at most this much of a payload (and a target): the SQL door takes any size,
# and a page must not load 30 MB to show it (issue 20). The page says when it shows a part.
PAYLOAD_SHOWN_BYTES = 64 * 1024
RECEIPTS_SHOWN = 10
# Dead letters grouped per queue: among each queue's newest this many (one index walk each;
# 1,000 per queue reads in ~40 ms at 10 million jobs, 10,000 took ~360 ms: bench_console).
DEAD_GROUPED = 1_000
# The overview's counters may be this old: the metrics sampler takes a sample every 5 s, and
# the console reuses it, never waiting for one in progress (counting overdue jobs alone took
# ~1 s with a 100,000-job ready backlog at 10 million jobs: bench_console).
COUNTERS_MAX_AGE_S = 7.0
DEAD_SHOWN = 20


# filters -------------------------------------------------------------------------------------
def age(seconds: float | None) -> str:
    """A duration the way an operator reads it: 45 s, 3 min 12 s, 2 h 5 min, 3 d 4 h."""
    if seconds is None:
        return "—"
    s = max(0, int(seconds))
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def when(value: datetime | str | None, ms: bool = False) -> str:
    """A time in UTC, to the second (RFC 3339 without the fraction), or to the millisecond."""
    if value is None:
        return "—"
    if isinstance(value, str):
        try:
            instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    else:
        instant = value
    utc = instant.astimezone(UTC)
    if ms:
        return utc.strftime("%Y-%m-%d %H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    return utc.strftime("%Y-%m-%d %H:%M:%SZ")


def when_ms(value: datetime | str | None) -> str:
    return when(value, ms=True)


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def add_filters(env: jinja2.Environment) -> None:
    env.filters.update(age=age, when=when, when_ms=when_ms, pretty=pretty, query=urlencode)


async def queue_rows(request: web.Request) -> list[dict[str, Any]]:
    """The API's queue overview (GET /v1/queues), with every daemon's starts per second (from
    the history's last two minutes) and the in-flight cap beside the running count."""
    rows = await api_of(request)[OPERATOR].queues(COUNTERS_MAX_AGE_S)
    rates = await request.app[HISTORY].recent_starts_per_s()
    for row in rows:
        row["starts_per_s"] = round(rates.get(row["name"], 0.0), 2)
        row["cap"] = row["limits"].get("max_inflight")
    return rows


async def overview(request: web.Request) -> web.StreamResponse:
    context = base_context(request, "Overview", "overview")
    schedules = await api_of(request)[OPERATOR].schedule_status()
    context.update(queues=await queue_rows(request), schedules=schedules, states=STATES)
    context["charts"] = await charts.history_charts(request, ALL_QUEUES)
    return render(request, "overview.html", context)


async def live(request: web.Request) -> web.StreamResponse:
    """The overview's live numbers: the queue counters (the charts refresh on their own)."""
    queues = {
        row["name"]: {
            **{state: row["jobs"][state] for state in STATES},
            "paused": "paused" if row["paused"] else "active",
            "oldest_ready": age(row["oldest_ready_age_s"]),
            "starts_per_s": f"{row['starts_per_s']:g}",
            "inflight": f"{row['jobs']['running']} / {row['cap'] if row['cap'] else '—'}",
            "overdue": row["overdue"],
        }
        for row in await queue_rows(request)
    }
    return web.json_response({"queues": queues})


# jobs --------------------------------------------------------------------------------------------
def page_size(raw: str | None) -> int:
    if raw is not None and is_ascii_number(raw, max_digits=3) and int(raw) in PAGE_SIZES:
        return int(raw)
    return PAGE_SIZES[0]


async def jobs(request: web.Request) -> web.StreamResponse:
    """The job list: the API's filters (GET /v1/jobs) and its keyset cursor."""
    context = base_context(request, "Jobs", "jobs")
    q = request.query
    given = {name: q.get(name, "") for name in FILTERS}
    limit = page_size(q.get("limit"))
    api = api_of(request)
    context.update(
        given=given,
        limit=limit,
        page_sizes=PAGE_SIZES,
        states=STATES,
        rows=[],
        next=None,
        queues=[row["name"] for row in await api[REPO].list_queues()],
        error="",
        error_scan_rows=None,
        searched=None,
        prefix_scan_ids=PREFIX_SCAN_IDS,
        bulk_actions=bulk.BULK_VERBS,
    )
    unknown = [name for name in q if name not in LIST_PARAMETERS]
    try:
        if unknown:
            raise FilterError(f"{unknown[0][:64]}: not a filter of this list")
        filters = parse_job_filter(q)
        cursor = parse_cursor(q.get("cursor"), filters)
    except FilterError as exc:
        context["error"] = str(exc)
        return render(request, "jobs.html", context, status=422)
    page = await api[REPO].list_summaries(filters, cursor=cursor, limit=limit)
    context["rows"] = page.rows
    context["searched"] = page.searched
    context["newest_searched"] = cursor is None  # the first page looks at the newest jobs
    if filters.error is not None and not await api[REPO].error_search_indexed():
        context["error_scan_rows"] = ERROR_SCAN_ROWS
    after = page_cursor(page, filters, limit)
    if after is not None:
        kept = {name: value for name, value in given.items() if value}
        context["next"] = urlencode({**kept, "limit": limit, "cursor": after})
    return render(request, "jobs.html", context)


def timeline(job: dict[str, Any], attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A job's life in time order: accepted, due, each attempt's start and end, its end."""
    events: list[dict[str, Any]] = [{"at": job["created_at"], "what": "accepted", "detail": ""}]
    if job["due_at"] is not None:
        events.append({"at": job["due_at"], "what": "due", "detail": ""})
    for a in attempts:
        if a["started_at"] is not None:
            events.append(
                {
                    "at": a["started_at"],
                    "what": f"attempt {a['attempt']} started",
                    "detail": a["owner"],
                }
            )
        detail = " ".join(str(x) for x in (a["reason"], a["http_status"]) if x)
        events.append(
            {
                "at": a["finished_at"],
                "what": f"attempt {a['attempt']} {a['outcome']}",
                "detail": detail,
            }
        )
    if job["finished_at"] is not None:
        events.append(
            {"at": job["finished_at"], "what": job["state"], "detail": job["dead_reason"] or ""}
        )
    events.sort(key=lambda e: e["at"])
    # to the millisecond where events share a second (five in one second read as one moment)
    seconds = [e["at"].replace(microsecond=0) for e in events]
    for event, second in zip(events, seconds, strict=True):
        event["precise"] = seconds.count(second) > 1
    return events


def payload_shown(job: dict[str, Any]) -> str:
    """The payload as the page shows it: whole and indented when it is at most
    PAYLOAD_SHOWN_BYTES, else its first PAYLOAD_SHOWN_BYTES characters as stored."""
    if job["payload_excerpt"] is not None:
        return str(job["payload_excerpt"])
    return pretty(job["payload"])


async def job_page(request: web.Request) -> web.StreamResponse:
    jid = job_id(request.match_info["id"])
    repo = api_of(request)[REPO]
    job = await repo.get_page(jid, PAYLOAD_SHOWN_BYTES)
    if job is None:
        raise Problem(404, f"No job {jid}.")
    cursor = request.query.get("attempts_before")
    before = int(cursor) if cursor and is_ascii_number(cursor, max_digits=18) else None
    attempts = await repo.attempts(jid, before_id=before, limit=ATTEMPTS_SHOWN)
    context = base_context(request, f"Job {jid}", "jobs")
    context.update(
        job=job,
        payload=payload_shown(job),
        payload_bytes=job["payload_bytes"],
        payload_cut=job["payload_excerpt"] is not None,
        payload_limit=PAYLOAD_SHOWN_BYTES,
        result=None if job["result"] is None else pretty(job["result"]),
        target=masked_target(job["target"], job["target_url"]),
        contract=contract_view(job),
        attempts=attempts,
        older=attempts[-1]["id"] if len(attempts) == ATTEMPTS_SHOWN else None,
        timeline=timeline(job, attempts) if before is None else [],
        actions=[
            (name, verb)
            for name, (verb, states, _) in JOB_ACTIONS.items()
            if job["state"] in states
        ],
    )
    return render(request, "job.html", context)


# dead letters ----------------------------------------------------------------------------------
async def dead(request: web.Request) -> web.StreamResponse:
    repo = api_of(request)[REPO]
    groups = await repo.dead_letter_groups(DEAD_GROUPED)
    per_queue: dict[str, int] = {}
    for group in groups:
        per_queue[group["queue"]] = per_queue.get(group["queue"], 0) + group["n"]
    for group in groups:  # the walk stopped at the cap: there may be more
        group["capped"] = per_queue[group["queue"]] >= DEAD_GROUPED
        group["query"] = urlencode(
            {"queue": group["queue"], "dead_reason": group["dead_reason"] or ""}
        )
    newest = await repo.list_summaries(
        parse_job_filter({"state": "dead"}), cursor=None, limit=DEAD_SHOWN
    )  # no key prefix: the whole answer up to DEAD_SHOWN
    context = base_context(request, "Dead letters", "dead")
    context.update(groups=groups, newest=newest.rows, cap=DEAD_GROUPED)
    return render(request, "dead.html", context)


# schedules --------------------------------------------------------------------------------------
async def schedules(request: web.Request) -> web.StreamResponse:
    operator = api_of(request)[OPERATOR]
    repo = api_of(request)[REPO]
    runs = RunRepository(repo.pool, repo)
    shown = []
    for status in await operator.schedule_status():
        service = operator.schedule(status["name"])
        receipts = [r.to_json() for r in await service.receipts(status["name"], RECEIPTS_SHOWN)]
        # of the pending units, those an earlier attempt failed: a run in trouble shows here
        retrying = await runs.retrying([r["run_key"] for r in receipts])
        for r in receipts:
            r["units"]["retrying"] = retrying.get(r["run_key"], 0)
        missed = status["missed"]["periods"]
        catch_from = min((m["period_start"] for m in missed), default="")
        catch_to = max((m["period_start"] for m in missed), default="")
        shown.append(
            {**status, "receipts": receipts, "catch_from": catch_from, "catch_to": catch_to}
        )
    context = base_context(request, "Schedules", "schedules")
    context.update(schedules=shown, receipts_shown=RECEIPTS_SHOWN)
    return render(request, "schedules.html", context)


ROUTES: list[Route] = [
    ("GET", "/", overview),
    ("GET", "/live.json", live),
    *charts.ROUTES,
    ("GET", "/jobs", jobs),
    *bulk.ROUTES,  # before /jobs/{id}, which would take "bulk" for a job id
    ("GET", "/jobs/{id}", job_page),
    ("GET", "/jobs/{id}/{action}", actions.job_confirm),
    ("POST", "/jobs/{id}/{action}", actions.job_act),
    ("GET", "/queues/{name}/{action}", actions.queue_confirm),
    ("POST", "/queues/{name}/{action}", actions.queue_act),
    ("GET", "/dead", dead),
    ("GET", "/dead/{action}", actions.dead_confirm),
    ("POST", "/dead/{action}", actions.dead_act),
    ("GET", "/schedules", schedules),
    ("GET", "/schedules/{name}/catch-up", actions.catch_up_confirm),
    ("POST", "/schedules/{name}/catch-up", actions.catch_up_act),
    ("GET", "/schedules/{name}/trigger", actions.trigger_confirm),
    ("POST", "/schedules/{name}/trigger", actions.trigger_act),
    ("GET", "/schedules/{name}/{action}", actions.schedule_confirm),
    ("POST", "/schedules/{name}/{action}", actions.schedule_act),
]
