"""Two daemons on one database under load: SKIP LOCKED claims and leases keep every effect
single, both instances work, and each holds its own in-flight limit (invariants 2 and 4)."""

from __future__ import annotations

import asyncio

from tests.faults.common import (
    create_effects_table,
    daemon_env,
    fetch,
    post_batch,
)
from tests.harness import until_job_states
from tests.harness.fixtures import Spawn

N_JOBS = 2000
MAX_INFLIGHT = 4


async def test_two_daemons_share_one_database_without_duplicates(db_url: str, spawn: Spawn) -> None:
    await create_effects_table(db_url, unique=True)
    env = daemon_env(db_url, DISPATCHER_QUEUES__DEFAULT__MAX_INFLIGHT=str(MAX_INFLIGHT))
    first, second = await asyncio.gather(
        spawn({**env, "DISPATCHER_INSTANCE_NAME": "alpha"}),
        spawn({**env, "DISPATCHER_INSTANCE_NAME": "beta"}),
    )
    jobs = [
        {"idempotency_key": f"shared-{i}", "handler": "record", "payload": {"sleep_s": 0.002}}
        for i in range(N_JOBS)
    ]
    # intake split across both instances, as behind a load balancer
    await asyncio.gather(
        post_batch(first.base_url, jobs[::2]), post_batch(second.base_url, jobs[1::2])
    )
    await until_job_states(db_url, {"succeeded": N_JOBS}, timeout_s=90)
    assert await asyncio.gather(first.stop(), second.stop()) == [0, 0]

    rows = await fetch(
        db_url,
        "SELECT instance, count(*) AS n, max(inflight) AS peak, "
        "count(DISTINCT job_key) AS keys FROM fault_effects "
        "GROUP BY instance ORDER BY instance",
    )
    per_instance = {r["instance"]: (r["n"], r["peak"]) for r in rows}
    print(f"\n{N_JOBS} jobs on two daemons: (effects, peak in flight) per instance {per_instance}")
    assert set(per_instance) == {"alpha", "beta"}  # both did work
    assert sum(n for n, _ in per_instance.values()) == N_JOBS  # UNIQUE(job_key) held too
    assert all(peak <= MAX_INFLIGHT for _, peak in per_instance.values()), per_instance
    for daemon in (first, second):
        # a duplicate attempt would have hit UNIQUE(job_key) and left a trace in the log
        assert "UniqueViolation" not in daemon.log_text()
        assert "lease lost" not in daemon.log_text()
