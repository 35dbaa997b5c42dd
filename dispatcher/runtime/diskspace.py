"""Free space on the filesystem of the embedded database (the state directory).

PostgreSQL on a full disk refuses writes (SQLSTATE 53100) and, if it cannot write its WAL,
stops. So the daemon keeps a reserve: below `state_dir_min_free_mb` it turns unready (with the
reason), answers intake with 503 (clients retry; nothing half-accepted), and says so in the
`dispatcher_state_dir_*` metrics; work already accepted goes on, and all of it returns to
normal by itself once space is back. A write PostgreSQL refuses for a full disk anyway (the
reserve was too small, or the disk filled between two looks) is answered 503 the same way
(`db.pool` translates 53100 at the boundary).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from dispatcher.observability import metrics

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # one statvfs call: cheap enough to notice a filling disk quickly
MB = 1024 * 1024


class DiskSpace:
    """The last look at the free space under `path`; `problem()` says why intake is refused."""

    def __init__(self, path: Path, reserve_bytes: int):
        self.path = path
        self.reserve_bytes = reserve_bytes
        self.free_bytes: int | None = None
        metrics.STATE_DIR_RESERVE.set(reserve_bytes)

    def problem(self) -> str | None:
        free = self.free_bytes
        if free is None or free >= self.reserve_bytes:
            return None
        return (
            f"disk full: {self.path} has {free / MB:.1f} MB free, below the "
            f"{self.reserve_bytes / MB:.0f} MB reserve (state_dir_min_free_mb); intake answers "
            "503 until space is freed there"
        )

    async def run_once(self) -> None:
        stats = await asyncio.to_thread(os.statvfs, self.path)
        was_low = self.problem() is not None
        self.free_bytes = stats.f_bavail * stats.f_frsize
        metrics.STATE_DIR_FREE.set(self.free_bytes)
        low = self.problem()
        metrics.STATE_DIR_LOW.set(1 if low else 0)
        if low and not was_low:
            log.error("%s", low)
        elif was_low and not low:
            log.info("disk space is back in %s: accepting jobs again", self.path)
