"""Who is judged gone (engine/gone_owners.py), on an injected clock: absent at every look
for the confirmation period, and never while a restart or this daemon's own lost lock is young."""

from __future__ import annotations

from dispatcher.engine.gone_owners import GoneOwners

OLD_SERVER_S = 3600.0  # uptime of a server that did not just restart


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def judge(clock: Clock) -> GoneOwners:
    return GoneOwners(confirm_s=1.0, grace_s=5.0, stale_s=3.0, clock=clock)


def test_an_owner_absent_at_every_look_for_a_second_is_gone() -> None:
    clock = Clock()
    j = judge(clock)
    assert j.observe(["a"], OLD_SERVER_S) == []  # one look is not enough
    clock.now += 0.5
    assert j.observe(["a"], OLD_SERVER_S) == []
    clock.now += 0.5
    assert j.observe(["a", "b"], OLD_SERVER_S) == ["a"]  # b was first absent just now
    assert j.confirmed() == ["a"]


def test_an_owner_seen_holding_its_lock_in_between_starts_over() -> None:
    clock = Clock()
    j = judge(clock)
    j.observe(["a"], OLD_SERVER_S)
    clock.now += 0.6
    j.observe([], OLD_SERVER_S)  # it took its lock again (a reconnect)
    clock.now += 0.6
    assert j.observe(["a"], OLD_SERVER_S) == []
    clock.now += 1.0
    assert j.observe(["a"], OLD_SERVER_S) == ["a"]


def test_nobody_is_judged_while_the_server_is_young() -> None:
    clock = Clock()
    j = judge(clock)
    # a restart dropped every lock: all look absent, none may be judged for 5 s of uptime
    j.observe(["a", "b"], server_uptime_s=1.0)
    clock.now += 2.0
    assert j.observe(["a", "b"], server_uptime_s=3.0) == []
    clock.now += 1.0
    assert j.observe(["a"], server_uptime_s=4.0) == []  # b is back
    clock.now += 1.5
    assert j.observe(["a"], server_uptime_s=5.5) == ["a"]  # a never came back


def test_a_lost_own_lock_forgets_every_look_and_waits_the_grace_after_retaking() -> None:
    clock = Clock()
    j = judge(clock)
    j.observe(["a"], OLD_SERVER_S)
    clock.now += 1.0
    assert j.observe(["a"], OLD_SERVER_S) == ["a"]
    j.lock_lost()
    assert j.confirmed() == []
    clock.now += 0.5
    j.lock_taken()
    j.observe(["a"], OLD_SERVER_S)
    clock.now += 4.0
    assert j.observe(["a"], OLD_SERVER_S) == []  # 4 s after the re-take: still in the grace
    clock.now += 1.0
    assert j.observe(["a"], OLD_SERVER_S) == ["a"]


def test_a_judge_that_stopped_looking_judges_nobody() -> None:
    clock = Clock()
    j = judge(clock)
    j.observe(["a"], OLD_SERVER_S)
    clock.now += 1.0
    assert j.observe(["a"], OLD_SERVER_S) == ["a"]
    clock.now += 3.5  # the lock's connection hangs: its last look is stale
    assert j.confirmed() == []
