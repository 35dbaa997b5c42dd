"""The `[database]` section: how the daemon learns of new work, and what it may ask of the
connection a URL gives (docs/pooling.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dispatcher.config.base import Strict


class DatabaseSettings(Strict):
    """listen: other daemons and the SQL door wake this one at once through LISTEN/NOTIFY, and a
    poll every scan_interval_s is the safety net. poll: for a URL through a transaction pooler
    (PgBouncer pool_mode=transaction, Supavisor's transaction port): no LISTEN, no session
    settings, no named prepared statements and no liveness lock; one poll every
    poll_interval_s finds work others enqueued (this daemon's own intake wakes it at once)."""

    wakeups: Literal["listen", "poll"] = "listen"
    # poll: how often one statement looks for ready queues, the next due time and expired
    # leases; a job another process enqueues starts within about this long
    poll_interval_s: float = Field(0.25, ge=0.01, le=60)

    @property
    def pooled(self) -> bool:
        """Whether connections go through a transaction pooler: no session state at all."""
        return self.wakeups == "poll"
