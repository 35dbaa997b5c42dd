"""Retention: terminal jobs older than their state's retention are deleted in bounded batches."""

from __future__ import annotations

import logging

from dispatcher import metrics
from dispatcher.config import RetentionSettings
from dispatcher.db.jobs import JobRepository

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
        ):
            total = 0
            for _ in range(MAX_BATCHES_PER_RUN):
                try:
                    n = await self._repo.prune_terminal(state, keep_s, s.batch)
                except Exception as exc:
                    log.warning("pruning %s jobs failed: %s", state, exc)
                    break
                total += n
                if n < s.batch:
                    break
            if total:
                metrics.PRUNED.labels(state).inc(total)
                log.info("pruned %d %s jobs older than %d s", total, state, keep_s)
            pruned[state] = total
        return pruned
