"""The console's page per queue (issue 22 point 7): its limits with where each came from (the
configuration file or a run-time override), its run-window state and next opening, the
priority mix of its ready jobs, the tenants with most of them and the concurrency keys at their
limit; and the run-time changes of
`PATCH /v1/queues/{name}` and their reset, behind the same confirm step as every console action
(a GET that shows what will change, then the POST of its form)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from dispatcher.api.keys import OPERATOR, REPO
from dispatcher.api.problems import Problem
from dispatcher.console import charts
from dispatcher.console.actions import acting, confirm, done
from dispatcher.console.pages import COUNTERS_MAX_AGE_S
from dispatcher.console.toolkit import PREFIX, Route, api_of, base_context, operate, render
from dispatcher.db.queue_limits import QueueSettingsRepository, QueueSettingsRow
from dispatcher.operator.queue_limits import LIVE_SETTINGS, SettingsChangeError, validate_change

# Ready jobs read for the priority mix and the waiting tenants: exact up to this backlog, a
# bounded index walk beyond it (the page says so).
READY_SCANNED = 100_000
TENANTS_SHOWN = 10
KEYS_SHOWN = 50
NUMBERS = {"rate_per_s": float, "key_rate_per_s": float}  # the others are whole numbers


async def queue_view(request: web.Request, name: str) -> dict[str, Any]:
    """The API's overview entry of queue `name` (GET /v1/queues), or 404 listing the queues."""
    operator = api_of(request)[OPERATOR]
    await operator.queue(name)
    views = await operator.queues(COUNTERS_MAX_AGE_S)
    return next(view for view in views if view["name"] == name)


async def queue_page(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    view = await queue_view(request, name)
    store = QueueSettingsRepository(api_of(request)[REPO].pool)
    mix, tenants = await store.ready_mix(name, READY_SCANNED, TENANTS_SHOWN)
    keys = await store.keys_at_limit(name)
    context = base_context(request, f"Queue {name}")
    context.update(
        q=view,
        mix=mix,
        tenants=tenants,
        keys=keys[:KEYS_SHOWN],
        keys_count=len(keys),
        scanned=READY_SCANNED,
        bounded=view["jobs"]["ready"] > READY_SCANNED,
        windows_text="\n".join(view["settings"]["windows"]["value"] or []),
        charts=await charts.history_charts(request, name),
    )
    return render(request, "queue.html", context)


def change_from_form(
    form: Any, view: dict[str, Any], stored: QueueSettingsRow | None
) -> dict[str, Any]:
    """The change a settings form asks for: a filled number sets an override, a ticked
    "remove" removes one, windows change when their text does. 422 names a bad field."""
    change: dict[str, Any] = {}
    for key in LIVE_SETTINGS:
        if form.get(f"remove_{key}"):
            change[key] = None
            continue
        raw = (form.get(key) or "").strip()
        if key == "windows":
            lines = [line.strip() for line in raw.splitlines() if line.strip()]
            if lines != (view["settings"]["windows"]["value"] or []):
                change[key] = lines
        elif raw:
            try:
                change[key] = NUMBERS.get(key, int)(raw)
            except ValueError:
                raise Problem(422, f"{key}: {raw[:40]!r} is not a number.") from None
    try:
        return validate_change(change, stored)
    except SettingsChangeError as exc:
        raise Problem(422, f"{exc}. Nothing changed.") from None


@operate
async def settings_confirm(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    view = await queue_view(request, name)
    stored = (await api_of(request)[OPERATOR].live_settings()).get(name)
    change = change_from_form(request.query, view, stored)
    lines = []
    for key, value in change.items():
        now = view["settings"][key]["value"]
        shown = "the file's value" if value is None else json.dumps(value)
        lines.append(f"{key}: {json.dumps(now)} → {shown}")
    lines.append(
        "Every daemon applies this within a second; it stays over restarts, also with a "
        "different configuration file, until the queue's settings are reset."
    )
    return confirm_change(request, name, f"Change queue {name}?", lines, "settings", change)


@operate
async def reset_confirm(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    view = await queue_view(request, name)
    overridden = [
        f"{key}: {json.dumps(entry['value'])} → {json.dumps(entry['file'])} (the file's)"
        for key, entry in view["settings"].items()
        if entry["source"] == "override"
    ]
    lines = overridden or ["The queue has no run-time override; nothing would change."]
    return confirm_change(request, name, f"Reset queue {name}?", lines, "reset", None)


def confirm_change(
    request: web.Request, name: str, title: str, lines: list[str], action: str, change: Any
) -> web.Response:
    """The confirm step: what will change, and the form whose POST makes the change."""
    return confirm(
        request,
        title=title,
        lines=lines,
        action=f"{PREFIX}/queues/{name}/{action}",
        button=title.rstrip("?"),
        back=f"{PREFIX}/queues/{name}",
        fields={} if change is None else {"change": json.dumps(change)},
    )


@operate
async def settings_act(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    try:
        change = json.loads(str(form.get("change") or ""))
    except ValueError:
        raise Problem(422, "The change was not sent; start again from the queue page.") from None
    return await act(request, name, change)


@operate
async def reset_act(request: web.Request) -> web.StreamResponse:
    return await act(request, request.match_info["name"], None)


async def act(request: web.Request, name: str, change: Any) -> web.Response:
    operator, actor = acting(request)
    await operator.change_queue_settings(actor, name, change)
    message = f"Queue {name}: settings {'reset' if change is None else 'changed'}."
    return done(request, message, [(f"{PREFIX}/queues/{name}", f"Queue {name}")])


# registered before the console's other queue routes: /queues/{name}/{action} is pause/resume
ROUTES: list[Route] = [
    ("GET", "/queues/{name}", queue_page),
    ("GET", "/queues/{name}/settings", settings_confirm),
    ("POST", "/queues/{name}/settings", settings_act),
    ("GET", "/queues/{name}/reset", reset_confirm),
    ("POST", "/queues/{name}/reset", reset_act),
]
