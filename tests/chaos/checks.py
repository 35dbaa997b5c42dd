"""The soak's invariant checks over what it recorded: pure functions, no I/O.

Times are `time.monotonic()` seconds of the soak process (the target records on the same clock).
Each check returns what it measured and the violations it found, one sentence each.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.chaos.cluster import LIMITED_QUEUE, Limits
from tests.chaos.targets import Hit

# A request reaches the target a little after its start was granted (a claim batch is sent over
# a few event-loop turns, on a loaded machine): starts within any 1 s at the target may use the
# rate of 1 s plus this much.
ARRIVAL_JITTER_S = 0.25
RATE_WINDOW_S = 1.0
# A limit change takes effect when the restarted daemon writes it; around a change either
# profile may be in force.
LIMIT_CHANGE_SLACK_S = 2.0
# Retry-After is honoured to this tolerance (the due-scan's interval and timer granularity).
RETRY_AFTER_SLACK_S = 0.3
# A daemon just thawed may still send what it claimed before it froze.
THAW_GRACE_S = 2.0
# Faults that explain a repeat of an answered HTTP key: a crash or a lease loss of its sender,
# or a database restart (the completion could not be written; its lease then expired).
CAUSES = ("kill", "freeze", "pg_restart")


@dataclass(frozen=True)
class Fault:
    kind: str  # kill | freeze | pg_restart | broker_cut | pause | limits
    subject: str  # a daemon (chaos-d1), a queue, "postgres", "broker"
    start: float
    end: float
    detail: str = ""


@dataclass(frozen=True)
class LimitSpan:
    """Profile `limits` may be in force in [start, end]."""

    start: float
    end: float
    limits: Limits


@dataclass
class Finding:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)


def http_repeats(hits: list[Hit], faults: list[Fault]) -> Finding:
    """Every request of a key carries that key and one webhook-id; after a 2xx was answered,
    a new request of the key is explained by a crash or lease loss of the daemon that got the
    2xx (or a database restart); a 429's Retry-After is honoured."""
    found = Finding()
    causes: Counter[str] = Counter()
    by_key: dict[str, list[Hit]] = defaultdict(list)
    for hit in hits:
        by_key[hit.key].append(hit)
    for key, key_hits in by_key.items():
        key_hits.sort(key=lambda h: h.opened)
        ids = {h.webhook_id for h in key_hits}
        if len(ids) != 1 or not key_hits[0].webhook_id:
            found.violations.append(f"key {key}: webhook-ids {sorted(ids)} (one expected)")
        if {h.idempotency_key for h in key_hits} != {key}:
            keys = sorted({h.idempotency_key for h in key_hits})
            found.violations.append(f"key {key}: Idempotency-Key {keys} (the job key expected)")
        _check_retry_after(key, key_hits, found)
        first_ok = next((h for h in key_hits if h.status and 200 <= h.status < 300), None)
        if first_ok is None or first_ok.answered is None:
            continue
        unexplained = []
        for repeat in (h for h in key_hits if h.opened > first_ok.answered):
            cause = _cause(first_ok, repeat, faults)
            causes[cause or "unexplained"] += 1
            if cause is None:
                unexplained.append(repeat.opened - first_ok.answered)
        if unexplained:
            found.violations.append(
                f"key {key} ({first_ok.behaviour}): {len(unexplained)} requests after "
                f"{first_ok.sender} got its {first_ok.status} (the first +{unexplained[0]:.1f} s "
                "later) with no crash, freeze or database restart in between"
            )
    found.figures = {"keys": len(by_key), "requests": len(hits), "repeats_by_cause": causes}
    return found


def _check_retry_after(key: str, key_hits: list[Hit], found: Finding) -> None:
    for earlier, later in itertools.pairwise(key_hits):
        if earlier.retry_after_s is None or earlier.answered is None:
            continue
        waited = later.opened - earlier.answered
        if waited < earlier.retry_after_s - RETRY_AFTER_SLACK_S:
            found.violations.append(
                f"key {key}: retried {waited:.2f} s after a 429 with Retry-After: "
                f"{earlier.retry_after_s:g}"
            )


def _cause(ok: Hit, repeat: Hit, faults: list[Fault]) -> str | None:
    """The injected fault that explains `repeat` of a key `ok` had answered, if any."""
    window_start, window_end = ok.opened - 1.0, repeat.opened
    for fault in faults:
        if fault.kind not in CAUSES or fault.start > window_end or fault.end < window_start:
            continue
        if fault.kind == "pg_restart" or fault.subject == ok.sender:
            return fault.kind
    # The repeat's own sender was frozen while it held an attempt claimed before the freeze:
    # its lease expired, another daemon ran the job and got the 2xx, and the thawed process
    # sent its stale request (seen in CI: frozen at t=121.1 s for 13.9 s, the stale request
    # 3.9 s after the other daemon's 200). No process can check its lease and send atomically.
    if excluded_as_frozen(repeat, faults):
        return "freeze"
    return None


def excluded_as_frozen(hit: Hit, faults: list[Fault]) -> bool:
    """A request of a daemon that was frozen while it was open, or that it sent just after its
    thaw (claimed before the freeze): a legitimate lease loss, kept out of the limit checks."""
    closed = hit.closed if hit.closed is not None else float("inf")
    return any(
        f.kind == "freeze"
        and f.subject == hit.sender
        and f.start <= closed
        and hit.opened <= f.end + THAW_GRACE_S
        for f in faults
    )


def bound_at(spans: list[LimitSpan], start: float, end: float) -> Limits:
    """The most generous profile that may be in force at some time in [start, end]."""
    candidates = [s.limits for s in spans if s.start <= end and s.end >= start]
    return max(candidates, key=lambda lim: (lim.rate_per_s, lim.burst, lim.max_inflight))


def limits_held(hits: list[Hit], faults: list[Fault], spans: list[LimitSpan]) -> Finding:
    """Starts per second within rate + burst and concurrent requests within max_inflight of the
    limited queue, measured at the target."""
    found = Finding()
    counted = [h for h in hits if h.queue == LIMITED_QUEUE and not excluded_as_frozen(h, faults)]
    starts = sorted(h.opened for h in counted)
    worst_rate = (0, 0.0)
    for i, t in enumerate(starts):
        n = bisect.bisect_left(starts, t + RATE_WINDOW_S) - i
        limits = bound_at(spans, t - LIMIT_CHANGE_SLACK_S, t + RATE_WINDOW_S)
        bound = limits.burst + limits.rate_per_s * (RATE_WINDOW_S + ARRIVAL_JITTER_S)
        if n / bound > worst_rate[1]:
            worst_rate = (n, n / bound)
        if n > bound:
            found.violations.append(
                f"{n} starts in {RATE_WINDOW_S:g} s at the target from t={t:.1f}, over the "
                f"bound {bound:g} (profile {limits.name}: rate {limits.rate_per_s:g}/s, burst "
                f"{limits.burst})"
            )
    worst_inflight = _inflight(counted, spans, found)
    found.figures = {
        "counted_requests": len(counted),
        "frozen_excluded": len(hits) - len(counted),
        "max_starts_in_1s": worst_rate[0],
        "worst_start_ratio": round(worst_rate[1], 3),
        "max_inflight_seen": worst_inflight,
    }
    found.violations = found.violations[:20]
    return found


def _inflight(counted: Iterable[Hit], spans: list[LimitSpan], found: Finding) -> int:
    events: list[tuple[float, int]] = []
    for hit in counted:
        events.append((hit.opened, 1))
        events.append((hit.closed if hit.closed is not None else float("inf"), -1))
    events.sort(key=lambda e: (e[0], e[1]))  # a close before an open at the same instant
    level = worst = 0
    for at, step in events:
        level += step
        worst = max(worst, level)
        if step > 0:
            limits = bound_at(spans, at - LIMIT_CHANGE_SLACK_S, at)
            if level > limits.max_inflight:
                found.violations.append(
                    f"{level} requests in flight at the target at t={at:.1f}, over "
                    f"max_inflight {limits.max_inflight} (profile {limits.name})"
                )
    return worst


@dataclass(frozen=True)
class JobRow:
    key: str
    state: str
    handler: str
    queue: str
    run_key: str | None
    dead_reason: str | None
    attempt: int


TERMINAL = frozenset({"succeeded", "dead", "cancelled", "discarded"})
BENIGN = frozenset({"ok", "slow", "flaky", "limited", "reset", "endless"})


def nothing_lost(accepted: dict[str, str], rows: dict[str, JobRow]) -> Finding:
    """Every accepted key exists and is terminal."""
    found = Finding()
    missing = [k for k in accepted if k not in rows]
    open_ = [k for k in accepted if k in rows and rows[k].state not in TERMINAL]
    if missing:
        found.violations.append(f"{len(missing)} accepted jobs missing, e.g. {missing[:5]}")
    if open_:
        states = Counter(rows[k].state for k in open_)
        found.violations.append(
            f"{len(open_)} accepted jobs not terminal after the settle time ({dict(states)}), "
            f"e.g. {open_[:5]}"
        )
    found.figures = {"accepted": len(accepted), "missing": len(missing), "not_terminal": len(open_)}
    return found


def effects_once(rows: dict[str, JobRow], runs: dict[str, int]) -> Finding:
    """In-database effects: one committed run per succeeded key, none for any other."""
    found = Finding()
    effect_rows = [r for r in rows.values() if r.handler in ("chaos_py", "chaos_sql")]
    for row in effect_rows:
        count = runs.get(row.key, 0)
        expected = 1 if row.state == "succeeded" else 0
        if count != expected:
            found.violations.append(
                f"key {row.key} ({row.handler}, {row.state}): effect committed {count} times, "
                f"expected {expected}"
            )
    found.violations = found.violations[:20]
    found.figures = {"effect_jobs": len(effect_rows), "effect_rows": len(runs)}
    return found


def cron_units(rows: dict[str, JobRow], units_per_run: int) -> Finding:
    """Each cron run has exactly its units (however many daemons fired or triggers repeated)."""
    found = Finding()
    per_run = Counter(r.run_key for r in rows.values() if r.run_key)
    wrong = {k: n for k, n in per_run.items() if n != units_per_run}
    if wrong:
        found.violations.append(f"cron runs with other than {units_per_run} units: {wrong}")
    found.figures = {"runs": len(per_run), "unit_jobs": sum(per_run.values())}
    return found


def outcomes_expected(rows: dict[str, JobRow], behaviours: dict[str, str]) -> Finding:
    """Jobs whose target or handler only misbehaves transiently end `succeeded`."""
    found = Finding()
    for key, behaviour in behaviours.items():
        row = rows.get(key)
        if row is not None and behaviour in BENIGN | {"effect"} and row.state == "dead":
            found.violations.append(
                f"key {key} ({behaviour}): dead ({row.dead_reason}) after {row.attempt} attempts"
            )
    found.violations = found.violations[:20]
    return found
