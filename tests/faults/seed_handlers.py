"""The handler of the seed scenario "10,000 grants due at 02:00" (loaded by the daemon as
`tests.faults.seed_handlers:revoke_expired_grants`).

Its business effect is one row in `seed_effects`, written on the connection of the transaction
that also records the job's completion: it commits with `succeeded` or not at all. Before that it
appends one line per execution to the file named by `SEED_EXECUTIONS_FILE`, outside any
transaction, so a test can tell executions (which may repeat) from effects (which must not).
A grant whose payload has `work_s` is a long-running cleanup: a statement that keeps the server
busy that long inside the transaction (as a large DELETE would), holding the job's row lock.
"""

from __future__ import annotations

import os
from typing import Any

INSTANCE = os.environ.get("DISPATCHER_INSTANCE_NAME") or f"pid-{os.getpid()}"
EFFECTS_TABLE = """
CREATE TABLE seed_effects (
    job_key  text NOT NULL,
    attempt  integer NOT NULL,
    instance text NOT NULL
)"""

# in the statement's text, so a test can see in pg_stat_activity that one is running
LONG_RUNNING_MARK = "/* long-running grant */"

_trace_fd: int | None = None


def _trace(line: str) -> None:
    global _trace_fd
    path = os.environ.get("SEED_EXECUTIONS_FILE")
    if not path:
        return
    if _trace_fd is None:
        _trace_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_trace_fd, line.encode())  # one short O_APPEND write: lines never interleave


async def revoke_expired_grants(job: Any, ctx: Any) -> dict[str, Any]:
    _trace(f"{job.key} {job.attempt} {INSTANCE}\n")
    work_s = job.payload.get("work_s")
    if work_s:
        await ctx.connection.execute(f"SELECT pg_sleep($1) {LONG_RUNNING_MARK}", work_s)
    await ctx.connection.execute(
        "INSERT INTO seed_effects (job_key, attempt, instance) VALUES ($1, $2, $3)",
        job.key,
        job.attempt,
        INSTANCE,
    )
    return {"revoked": job.key}
