"""The `[limits]` section: what one job may carry, whatever door it comes through."""

from __future__ import annotations

from pydantic import Field

from dispatcher.config.base import Strict

# The smallest limit allowed: every door measures a job's JSON only when it could exceed this.
MIN_PAYLOAD_LIMIT = 1024


class IntakeLimits(Strict):
    """Per-job limits every door enforces (HTTP, batch items, the SQL door, schedules)."""

    # The bytes of a job's payload and target as JSON text (UTF-8, as PostgreSQL renders
    # jsonb). A batch checks each item; the request body limit (body_limit_bytes) still bounds
    # the whole request.
    max_payload_bytes: int = Field(256 * 1024, ge=MIN_PAYLOAD_LIMIT, le=64 * 1024 * 1024)
