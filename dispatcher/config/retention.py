"""The `[retention]` section: how long terminal jobs, their keys, run receipts and the
per-minute history stay."""

from __future__ import annotations

from pydantic import Field, model_validator

from dispatcher.config.base import MAX_DURATION_S, Strict


class RetentionSettings(Strict):
    """How long terminal jobs stay visible before the pruner deletes them (in bounded batches)."""

    succeeded_s: int = Field(7 * 86400, ge=0, le=MAX_DURATION_S)
    cancelled_s: int = Field(7 * 86400, ge=0, le=MAX_DURATION_S)
    # Dead letters are what an operator must see: never pruned sooner than a day.
    dead_s: int = Field(30 * 86400, ge=86400, le=MAX_DURATION_S)
    # Cron run receipts, once finished and their units pruned.
    runs_s: int = Field(90 * 86400, ge=86400, le=MAX_DURATION_S)
    # A pruned job's key, fingerprint, id and final state (the key ledger): a replay within this
    # long after the job finished answers with that job instead of running again.
    keys_s: int = Field(90 * 86400, ge=86400, le=MAX_DURATION_S)
    # The per-minute history of every queue (the console's charts, GET /v1/history): at least
    # an hour, so the 15-minute chart always has its minutes; the 7-day chart wants 7 days.
    history_s: int = Field(7 * 86400, ge=3600, le=MAX_DURATION_S)
    batch: int = Field(1000, ge=1, le=100_000)
    interval_s: float = Field(60.0, gt=0, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _keys_outlive_jobs(self) -> RetentionSettings:
        # a ledger row is written when its job is pruned: a shorter window would drop it at once
        longest = max(
            ("succeeded_s", self.succeeded_s),
            ("cancelled_s", self.cancelled_s),
            ("dead_s", self.dead_s),
            key=lambda item: item[1],
        )
        if self.keys_s <= longest[1]:
            raise ValueError(
                f"keys_s ({self.keys_s}) must be longer than every job retention, but "
                f"{longest[0]} is {longest[1]}: raise [retention] keys_s above {longest[1]} "
                f"(or shorten {longest[0]}), or a replay after pruning would run again"
            )
        return self
