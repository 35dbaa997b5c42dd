"""The soak's checks on recorded data: each one flags what it must and spares what it must
(a check that can never fail proves nothing)."""

from __future__ import annotations

from typing import Any

from tests.chaos import checks
from tests.chaos.checks import Fault, JobRow, LimitSpan
from tests.chaos.cluster import LIMITED_QUEUE, PROFILES
from tests.chaos.soak import STALL_BOUND_S, Monitor
from tests.chaos.targets import Hit

A = PROFILES[0]  # rate 15/s, burst 5, max_inflight 6
ALWAYS_A = [LimitSpan(0.0, float("inf"), A)]


def hit(key: str, opened: float, status: int = 200, sender: str = "chaos-d0", **kw: Any) -> Hit:
    fields: dict[str, Any] = {
        "idempotency_key": key,
        "webhook_id": key,
        "queue": LIMITED_QUEUE,
        "behaviour": "ok",
        "answered": opened + 0.01,
        "closed": opened + 0.02,
        "status": status,
    }
    fields.update(kw)
    return Hit(key=key, sender=sender, opened=opened, **fields)


def test_a_repeat_after_a_2xx_needs_a_crash_of_its_sender() -> None:
    hits = [hit("k", 1.0), hit("k", 12.0, sender="chaos-d1")]
    unexplained = checks.http_repeats(hits, [])
    assert len(unexplained.violations) == 1 and "k (ok)" in unexplained.violations[0]
    other = checks.http_repeats(hits, [Fault("kill", "chaos-d2", 2.0, 3.0)])
    assert other.violations, "a crash of another daemon explains nothing"
    killed = checks.http_repeats(hits, [Fault("kill", "chaos-d0", 2.0, 3.0)])
    assert killed.violations == []
    assert killed.figures["repeats_by_cause"] == {"kill": 1}
    restarted = checks.http_repeats(hits, [Fault("pg_restart", "postgres", 0.5, 4.0)])
    assert restarted.violations == []
    cut = checks.http_repeats(hits, [Fault("broker_cut", "broker", 2.0, 3.0)])
    assert cut.violations, "a broker cut is no reason to repeat a recorded 2xx"


def test_a_stale_request_of_a_thawed_daemon_is_explained_by_its_freeze() -> None:
    """d2 claims, is frozen before it sends; its lease expires, d1 runs the job and gets the
    200; d2 thaws and sends its stale request: caused by d2's freeze, not unexplained."""
    hits = [hit("k", 10.0, sender="chaos-d1"), hit("k", 13.9, sender="chaos-d2")]
    thawed = checks.http_repeats(hits, [Fault("freeze", "chaos-d2", 0.0, 13.8)])
    assert thawed.violations == []
    assert thawed.figures["repeats_by_cause"] == {"freeze": 1}
    long_after = checks.http_repeats(hits, [Fault("freeze", "chaos-d2", 0.0, 5.0)])
    assert long_after.violations, "a freeze that ended long before explains nothing"


def test_retries_before_a_2xx_are_not_repeats() -> None:
    hits = [hit("k", 1.0, status=500), hit("k", 2.0)]
    assert checks.http_repeats(hits, []).violations == []


def test_every_attempt_carries_the_key_and_one_webhook_id() -> None:
    hits = [hit("k", 1.0, status=500), hit("k", 2.0, webhook_id="other")]
    assert "webhook-ids" in checks.http_repeats(hits, []).violations[0]
    hits = [hit("k", 1.0, status=500), hit("k", 2.0, idempotency_key="x")]
    assert "Idempotency-Key" in checks.http_repeats(hits, []).violations[0]


def test_retry_after_is_honoured() -> None:
    limited = hit("k", 1.0, status=429, retry_after_s=1.0)
    early = checks.http_repeats([limited, hit("k", 1.5)], [])
    assert "Retry-After" in early.violations[0]
    assert checks.http_repeats([limited, hit("k", 2.1)], []).violations == []


def test_starts_per_second_beyond_rate_and_burst_are_flagged() -> None:
    bound = A.burst + A.rate_per_s * (checks.RATE_WINDOW_S + checks.ARRIVAL_JITTER_S)
    within = [hit(f"k{i}", 10 + i * 0.01) for i in range(int(bound))]
    assert checks.limits_held(within, [], ALWAYS_A).violations == []
    over = [hit(f"k{i}", 10 + i * 0.01) for i in range(int(bound) + 1)]
    assert "starts in 1 s" in checks.limits_held(over, [], ALWAYS_A).violations[0]


def test_requests_in_flight_beyond_max_inflight_are_flagged() -> None:
    def open_at_once(n: int, sender: str = "chaos-d0") -> list[Hit]:
        return [hit(f"k{i}", 10 + i, closed=100.0, sender=sender) for i in range(n)]

    assert checks.limits_held(open_at_once(A.max_inflight), [], ALWAYS_A).violations == []
    found = checks.limits_held(open_at_once(A.max_inflight + 1), [], ALWAYS_A)
    assert "in flight" in found.violations[0]
    assert found.figures["max_inflight_seen"] == A.max_inflight + 1
    # the same requests from a daemon frozen while they were open: a lease loss, not counted
    frozen = [Fault("freeze", "chaos-d0", 50.0, 60.0)]
    assert checks.limits_held(open_at_once(A.max_inflight + 1), frozen, ALWAYS_A).violations == []


def test_around_a_limit_change_the_larger_profile_bounds() -> None:
    b = PROFILES[1]
    spans = [LimitSpan(0.0, 20.0, A), LimitSpan(19.0, float("inf"), b)]
    # the seventh request opens at t=20 (B may hold), or at t=7 (only A)
    late = [hit(f"k{i}", 14 + i, closed=100.0) for i in range(A.max_inflight + 1)]
    assert checks.limits_held(late, [], spans).violations == []
    early = [hit(f"k{i}", 1 + i, closed=100.0) for i in range(A.max_inflight + 1)]
    assert checks.limits_held(early, [], spans).violations


def row(key: str, state: str = "succeeded", handler: str = "chaos_py", **kw: Any) -> JobRow:
    fields: dict[str, Any] = {"queue": "db", "run_key": None, "dead_reason": None, "attempt": 1}
    fields.update(kw)
    return JobRow(key=key, state=state, handler=handler, **fields)


def test_nothing_lost_wants_every_accepted_key_terminal() -> None:
    rows = {"a": row("a"), "b": row("b", state="running")}
    found = checks.nothing_lost({"a": "api/python", "b": "sql/python", "c": "api/http"}, rows)
    assert len(found.violations) == 2
    assert checks.nothing_lost({"a": "api/python"}, rows).violations == []


def test_effects_commit_once_per_succeeded_key_and_never_for_a_dead_one() -> None:
    rows = {"a": row("a"), "b": row("b", handler="chaos_sql"), "c": row("c", state="dead")}
    assert checks.effects_once(rows, {"a": 1, "b": 1}).violations == []
    assert len(checks.effects_once(rows, {"a": 2, "b": 0, "c": 1}).violations) == 3


def test_a_cron_run_has_exactly_its_units() -> None:
    rows = {f"r:{u}": row(f"r:{u}", run_key="r") for u in range(4)}
    assert checks.cron_units(rows, 4).violations == []
    rows["r:4"] = row("r:4", run_key="r")
    assert checks.cron_units(rows, 4).violations


def test_a_queue_with_work_and_no_progress_past_its_bound_is_a_stall() -> None:
    monitor = Monitor(pool=None, daemons=None)  # type: ignore[arg-type]  # only _stalls runs
    stuck = {"name": "web", "paused": False, "runnable": 3, "oldest": 7}
    for t in (0.0, 10.0, STALL_BOUND_S - 1):
        monitor._stalls([stuck], t)
    assert monitor.violations == []
    monitor._stalls([stuck], STALL_BOUND_S + 1)
    assert "not started for" in monitor.violations[0]
    moving = Monitor(pool=None, daemons=None)  # type: ignore[arg-type]
    for t in range(0, int(STALL_BOUND_S) + 5, 5):
        moving._stalls([{**stuck, "oldest": t}], float(t))
    assert moving.violations == []
    paused = Monitor(pool=None, daemons=None)  # type: ignore[arg-type]
    for t in (0.0, STALL_BOUND_S + 1):
        paused._stalls([{**stuck, "paused": True}], t)
    assert paused.violations == [] and paused.worst_stall_s["web"] == 0.0
