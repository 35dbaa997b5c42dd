"""Bulk actions on jobs: retry, cancel, discard, reschedule or run now every job of a selection
(up to `MAX_IDS` ids) or of a filter (the job list's), in batches of `BULK_BATCH` jobs per
transaction, with a dry run that counts and shows a sample.

Each job moves only from the states the one-job action accepts (`TRANSITIONS`); the others are
counted per state with the reason. Idempotent by key: a bulk action is recorded under its key
(migration 037) and each batch advances the record in the transaction that moves its jobs, so
asking again with the same key resumes an action that was cut off where it stopped, and answers
a finished one with what it did, changing nothing more. Only jobs that existed when the action
began are taken (the fence), so it always ends. Two requests never walk one key together (a
batch commits only if the walk was where its walker left it); two actions with other keys over
the same jobs never move a job twice, since each move locks its rows and checks their state."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from dispatcher.core import rfc3339
from dispatcher.db.bulk import BulkStore, Move, Overtaken, Selection, Walker
from dispatcher.operator.errors import Conflict, Invalid

# Jobs per batch (one statement and one transaction each): a million-row filter never holds a
# long transaction, and each batch stays well under a second.
BULK_BATCH = 500
# A selection by ids names at most this many (a page of the list is at most 100).
MAX_IDS = 1000
# A dry run counts at most this many jobs (a count of 10 million rows would take seconds).
COUNT_CAP = 1_000_000
SAMPLE = 10


@dataclass(frozen=True)
class Transition:
    """Which states a job action applies to, and why it does not apply to the others."""

    states: tuple[str, ...]
    rule: str  # "only dead jobs can be discarded"
    hints: dict[str, str] = field(default_factory=dict)  # more words for some states

    def reason(self, state: str) -> str:
        return self.rule + self.hints.get(state, "")


TRANSITIONS = {
    "retry": Transition(
        ("dead", "cancelled", "discarded"), "only dead, cancelled or discarded jobs can be retried"
    ),
    "cancel": Transition(
        ("scheduled", "ready", "running"),
        "only scheduled, ready or running jobs can be cancelled",
        # a dead job is not cancelled: an operator discards it (one verb per verdict)
        {"dead": "; to set a dead letter aside, discard it"},
    ),
    "discard": Transition(("dead",), "only dead jobs can be discarded"),
    "reschedule": Transition(
        ("scheduled", "ready"), "only scheduled or ready jobs can be rescheduled"
    ),
    "run_now": Transition(
        ("scheduled",), "only scheduled jobs can be run now", {"ready": " (it is ready already)"}
    ),
}
ACTIONS = tuple(TRANSITIONS)


@dataclass(frozen=True)
class BulkRequest:
    """One bulk action as a door read it. `due_at`: a reschedule's time (None: now); `key`:
    the idempotency key (None: a new bulk action, its key made up and answered)."""

    action: str
    selection: Selection
    due_at: datetime | None = None
    dry_run: bool = False
    key: str | None = None

    def fingerprint(self) -> str:
        """What the action does to which jobs: the same key with another request is refused."""
        s = self.selection
        described = {
            "action": self.action,
            "ids": sorted(set(s.ids)) if s.ids is not None else None,
            "filter": _filter_text(self),
            "due_at": rfc3339.format(self.due_at) if self.due_at else None,
        }
        return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def check(request: BulkRequest) -> None:
    """Invalid naming the field for what no door may send (the doors check their shapes)."""
    if request.action not in TRANSITIONS:
        raise Invalid(f"unknown action {request.action[:40]!r}; actions: {', '.join(ACTIONS)}")
    s = request.selection
    if (s.ids is None) == (s.filters is None):
        raise Invalid('give "ids" or a "filter": one of them')
    if s.ids is not None and not 1 <= len(s.ids) <= MAX_IDS:
        raise Invalid(f"from 1 to {MAX_IDS} job ids; for more, use a filter", "ids")
    if request.due_at is not None and request.action != "reschedule":
        raise Invalid(f"only a reschedule takes a due time, not {request.action}", "due_at")


def describe(request: BulkRequest) -> str:
    """The selection of a bulk action, for its audit line."""
    s = request.selection
    if s.ids is not None:
        shown = ",".join(str(i) for i in s.ids[:20]) + (",..." if len(s.ids) > 20 else "")
        what = f"jobs {shown} ({len(s.ids)})"
    else:
        what = f"jobs matching {_filter_text(request) or '(all)'}"
    if request.action == "reschedule":
        what += f" to {rfc3339.format(request.due_at) if request.due_at else 'now'}"
    return what + (f" key {request.key[:80]!r}" if request.key else "")


def _filter_text(request: BulkRequest) -> str:
    f = request.selection.filters
    if f is None:
        return ""
    given = {x.name: getattr(f, x.name) for x in fields(f) if getattr(f, x.name) is not None}
    return " ".join(
        f"{k}={rfc3339.format(v) if isinstance(v, datetime) else v}" for k, v in given.items()
    )


async def dry_run(store: BulkStore, request: BulkRequest) -> dict[str, Any]:
    """What the action would do now: jobs per state of the selection, how many it would move,
    and the first few jobs it would look at. Changes nothing."""
    fence = await store.fence()
    counts = await store.count(request.selection, fence, COUNT_CAP)
    transition = TRANSITIONS[request.action]
    sample = await store.sample(request.selection, fence, SAMPLE)
    matched = sum(counts.values())
    result = {
        "action": request.action,
        "dry_run": True,
        "matched": matched,
        "would_apply": sum(n for s, n in counts.items() if s in transition.states),
        "skipped": _skipped(transition, counts),
        "count_capped": matched >= COUNT_CAP,
        "sample": [{"id": r["id"], "state": r["state"]} for r in sample],
    }
    if request.selection.ids is not None:
        result["not_found"] = len(set(request.selection.ids)) - matched
    return result


async def apply(
    store: BulkStore, request: BulkRequest, actor: str, *, batch: int = BULK_BATCH
) -> dict[str, Any]:
    """Walk the selection in batches of `batch` and move what the action applies to; the
    result counts what was applied, skipped (per state, with the reason) and busy."""
    key = request.key or f"bulk-{uuid.uuid4().hex}"
    async with store.walker() as walker:
        fence = await store.fence()
        record = await walker.begin(key, request.action, request.fingerprint(), actor, fence)
        if record["request_hash"] != request.fingerprint():
            raise Conflict(
                f"the key {key[:80]!r} names another bulk action ({record['action']} of "
                f"another selection); use a new key"
            )
        tally = dict(record["counts"]) or _empty()
        if record["finished_at"] is None:
            try:
                await _walk(walker, request, record, tally, batch)
            except Overtaken:
                raise Conflict(
                    f"bulk action {key[:80]!r} is running now in another request; ask again "
                    "once it ended (with the same key it answers what it did)"
                ) from None
    return _result(request, key, tally, replayed=record["finished_at"] is not None)


async def _walk(
    walker: Walker, request: BulkRequest, record: dict[str, Any], tally: dict[str, Any], batch: int
) -> None:
    transition = TRANSITIONS[request.action]
    seen = record["cursor_id"]  # where the walk is; only this walker moves it on
    before = seen if seen is not None else record["fence_id"] + 1
    while True:
        page = await walker.page(request.selection, before, batch)
        if not page:
            async with walker.transaction():
                await walker.turn(record["id"], seen)
                await walker.progress(record["id"], seen, before, tally, done=True)
            return
        chosen = [job_id for job_id, state in page if state in transition.states]
        for _, state in page:
            if state not in transition.states:
                tally["skipped"][state] = tally["skipped"].get(state, 0) + 1
        before = page[-1][0]
        last = len(page) < batch
        tally["matched"] += len(page)
        tally["batches"] += 1
        # the jobs and the record change in one transaction: a walk cut off between two
        # batches resumes after the last one that committed, and its counts are exact
        async with walker.transaction():
            await walker.turn(record["id"], seen)  # first: a second walker of this key stops
            move = Move(request.action, chosen, request.due_at, transition.states)
            moved = await walker.move(move)
            _count(tally, chosen, moved)
            await walker.progress(record["id"], seen, before, tally, done=last)
        seen = before
        if last:
            return


def _count(tally: dict[str, Any], chosen: list[int], moved: list[dict[str, Any]]) -> None:
    tally["applied"] += len(moved)
    tally["busy"] += len(chosen) - len(moved)
    for row in moved:
        tally["became"][row["state"]] = tally["became"].get(row["state"], 0) + 1


def _empty() -> dict[str, Any]:
    return {"matched": 0, "applied": 0, "busy": 0, "batches": 0, "skipped": {}, "became": {}}


def _skipped(transition: Transition, counts: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {
        state: {"count": n, "reason": transition.reason(state)}
        for state, n in sorted(counts.items())
        if state not in transition.states and n
    }


def _result(
    request: BulkRequest, key: str, tally: dict[str, Any], *, replayed: bool
) -> dict[str, Any]:
    transition = TRANSITIONS[request.action]
    result = {
        "bulk_id": key,
        "action": request.action,
        "dry_run": False,
        "replayed": replayed,
        "matched": tally["matched"],
        "applied": tally["applied"],
        "became": tally["became"],
        "skipped": _skipped(transition, tally["skipped"]),
        "busy": tally["busy"],
        "batches": tally["batches"],
    }
    if request.selection.ids is not None:
        result["not_found"] = len(set(request.selection.ids)) - tally["matched"]
    return result
