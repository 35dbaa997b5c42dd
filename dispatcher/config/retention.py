"""The `[retention]` section: how long terminal jobs and run receipts stay."""

from __future__ import annotations

from pydantic import Field

from dispatcher.config.base import MAX_DURATION_S, Strict


class RetentionSettings(Strict):
    """How long terminal jobs stay visible before the pruner deletes them (in bounded batches)."""

    succeeded_s: int = Field(7 * 86400, ge=0, le=MAX_DURATION_S)
    cancelled_s: int = Field(7 * 86400, ge=0, le=MAX_DURATION_S)
    # Dead letters are what an operator must see: never pruned sooner than a day.
    dead_s: int = Field(30 * 86400, ge=86400, le=MAX_DURATION_S)
    # Cron run receipts, once finished and their units pruned.
    runs_s: int = Field(90 * 86400, ge=86400, le=MAX_DURATION_S)
    batch: int = Field(1000, ge=1, le=100_000)
    interval_s: float = Field(60.0, gt=0, le=MAX_DURATION_S)
