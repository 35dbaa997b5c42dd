"""The dispatcher handler of the peer benchmark: a no-op that records when it started.

Each call appends its own start (wall clock) and the job's `due_at`; at exit the daemon writes
both lists as JSON to the file named by `PEERS_RECORD_FILE`, the same shape the peers' workers
write, so every system's start times are taken at the same point: on entry to the handler.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from typing import Any

STARTS: list[float] = []
DUE: list[Any] = []


async def record(job: Any, ctx: Any) -> None:
    STARTS.append(time.time())
    DUE.append(job.due_at)


def _dump() -> None:
    path = os.environ.get("PEERS_RECORD_FILE")
    if path:
        with open(path, "w") as f:
            json.dump({"starts": STARTS, "refs": [d.timestamp() for d in DUE]}, f)


atexit.register(_dump)
