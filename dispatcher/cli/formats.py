"""How the commands print jobs, attempts, queues and schedules for a terminal."""

from __future__ import annotations

import json
from typing import Any

from dispatcher.cli.common import plain
from dispatcher.model import STATES


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
    text = "\n".join(f"{k:<{width}}  {plain(v)}" for k, v in fields.items())
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
            f"{plain(a['http_status']):>4} {latency:>11}  {detail}"
        )
    return "\n".join(lines)


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


def format_schedule(entry: dict[str, Any]) -> str:
    lines = [
        f"{entry.get('name')}  cron={entry.get('cron')!r} tz={entry.get('timezone')} "
        f"enabled={entry.get('enabled')} next={entry.get('next_fire_at')}"
    ]
    if entry.get("description"):
        lines.append(f"  fires {entry['description']} ({entry.get('timezone')} time)")
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
