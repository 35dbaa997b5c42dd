"""Retention: terminal jobs (their keys kept in the key ledger), then run receipts whose units are
gone, then ledger keys past `keys_s`, then finished bulk actions' records (kept as long as dead
letters), then the per-minute history past `history_s`, deleted in bounded batches."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from dispatcher.config.settings import RetentionSettings
from dispatcher.db import bulk
from dispatcher.db.history import HistoryStore
from dispatcher.db.jobs import JobRepository
from dispatcher.observability import metrics

log = logging.getLogger(__name__)

# At most this many batches per run, so one run never holds the database for long.
MAX_BATCHES_PER_RUN = 20


class Pruner:
    def __init__(self, repo: JobRepository, settings: RetentionSettings):
        self._repo = repo
        self._settings = settings

    async def run_once(self) -> dict[str, int]:
        s = self._settings
        pruned: dict[str, int] = {}
        for state, keep_s in (
            ("succeeded", s.succeeded_s),
            ("cancelled", s.cancelled_s),
            ("dead", s.dead_s),
            # a discarded job is a dead letter set aside: kept exactly as long, from its death
            ("discarded", s.dead_s),
        ):

            def prune_state(state: str = state, keep_s: int = keep_s) -> Awaitable[int]:
                return self._repo.prune_terminal(state, keep_s, s.batch)

            pruned[state] = await self._batches(state, keep_s, prune_state)
        pruned["runs"] = await self._batches(
            "runs", s.runs_s, lambda: self._repo.prune_runs(s.runs_s, s.batch)
        )
        pruned["keys"] = await self._batches(
            "keys", s.keys_s, lambda: self._repo.prune_keys(s.keys_s, s.batch)
        )
        # a finished bulk action's key answers a replay for as long as a dead letter it may
        # have moved is kept
        pruned["bulk_actions"] = await self._batches(
            "bulk_actions", s.dead_s, lambda: bulk.prune(self._repo.pool, s.dead_s, s.batch)
        )
        history = HistoryStore(self._repo.pool)
        pruned["history"] = await self._batches(
            "history", s.history_s, lambda: history.prune(s.history_s, s.batch)
        )
        return pruned

    async def _batches(self, what: str, keep_s: int, prune: Callable[[], Awaitable[int]]) -> int:
        total = 0
        for _ in range(MAX_BATCHES_PER_RUN):
            try:
                n = await prune()
            except Exception as exc:  # the next run retries; retention is never urgent
                log.warning("pruning %s failed: %s", what, exc)
                break
            total += n
            if n < self._settings.batch:
                break
        if total:
            metrics.PRUNED.labels(what).inc(total)
            log.info("pruned %d %s older than %d s", total, what, keep_s)
        return total
