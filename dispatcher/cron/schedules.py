"""Schedule configuration: one `[[schedules]]` table per cron schedule, validated at start-up.

```toml
[[schedules]]
name = "session-cleanup"
cron = "15 3 * * *"              # standard 5 fields; L, W, #, ?, @reboot are refused
timezone = "Europe/Berlin"       # IANA name; DST handled (see dispatcher.cron.expression)
handler = "expire_sessions"      # "http" (then `target` is required) or a [handlers] name
params = { page_hint = 1 }       # base payload of every unit
fanout = { ranges = 16, key_space = [0, 65536] }   # or { tenants = [...] } or { sql = "..." }
queue = "maintenance"
priority = 50                    # -100..100, lower runs first (default 0): after other work
concurrency_key = "cleanup"      # per-key limits count by it (default: each unit's tenant;
                                 # "" for none)
overlap = "skip"                 # allow | skip | queue, when the previous run is unfinished
misfire_grace_s = 300            # a fire this late still counts as on time
on_finished = { handler = "report", payload = { channel = "ops" } }   # optional, see below
```

Every unit's payload is `params` plus `schedule`, `period_start` (RFC 3339, UTC), `unit` and the
fan-out's fields: `tenant` for tenants; `range_start`, `range_end` (exclusive), `range_index`,
`range_count` for ranges.

`on_finished` (the fan-out join): when every unit of a run is terminal, exactly one follow-up
job is enqueued with key `<run_key>:finished` (in the queue given, else the schedule's), its
payload `payload` plus `schedule`, `period_start`, `run_key`, `units` and the run's counts
`succeeded`, `dead`, `discarded`, `cancelled`. A run the overlap policy skipped has no units
and no follow-up.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from dispatcher.core import rfc3339
from dispatcher.cron.expression import (
    UNIT_NAME,
    CronSchedule,
    PeriodError,
    Unit,
    load_zone,
    parse_cron,
    range_units,
    run_key,
    tenant_units,
    unit_key,
)
from dispatcher.model import NewJob

# The same rule as queue and handler names; no ':' because it separates the parts of a key.
SCHEDULE_NAME = r"^[a-z][a-z0-9_.-]{0,62}$"
RESERVED_PAYLOAD_KEYS = frozenset(
    {
        "schedule",
        "period_start",
        "unit",
        "tenant",
        "range_start",
        "range_end",
        "range_index",
        "range_count",
    }
)


# The unit name the follow-up's key ends with (`<run_key>:finished`), so no unit may take it.
FOLLOW_UP_UNIT = "finished"
FOLLOW_UP_KEYS = frozenset(
    {
        "schedule",
        "period_start",
        "run_key",
        "units",
        "succeeded",
        "dead",
        "discarded",
        "cancelled",
    }
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _json_values(value: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{what} must be JSON values (TOML dates and times are not: quote them)"
        ) from None
    return value


class FollowUp(_Strict):
    """The job enqueued once when every unit of a run is terminal (`on_finished`)."""

    handler: str
    payload: dict[str, Any] = {}
    queue: str | None = None  # None: the schedule's queue
    target: dict[str, Any] | None = None

    @field_validator("payload")
    @classmethod
    def _payload(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(FOLLOW_UP_KEYS & set(value))
        if clash:
            raise ValueError(
                f"on_finished.payload may not set {clash}: the dispatcher fills those in with "
                "the run and its counts"
            )
        return _json_values(value, "on_finished.payload")

    @model_validator(mode="after")
    def _target(self) -> FollowUp:
        if self.handler == "http":
            if not self.target or not isinstance(self.target.get("url"), str):
                raise ValueError(
                    'on_finished handler "http" needs target = { url = "https://..." }'
                )
        elif self.target is not None:
            raise ValueError(
                f'on_finished handler {self.handler!r} takes no target (only "http" does)'
            )
        return self


class TenantsFanout(_Strict):
    """One unit per listed tenant; each job is claimed fairly under its tenant."""

    tenants: list[str] = Field(min_length=1, max_length=100_000)

    @field_validator("tenants")
    @classmethod
    def _valid_names(cls, value: list[str]) -> list[str]:
        for tenant in value:
            if not UNIT_NAME.match(tenant):
                raise ValueError(f"tenant {tenant!r} must be 1-100 printable ASCII characters")
        if len(set(value)) != len(value):
            raise ValueError("tenants must be unique (each names one unit of a run)")
        return value


class RangesFanout(_Strict):
    """`ranges` contiguous ranges [range_start, range_end) splitting `key_space` [low, high).

    A key space of a hash (the default, 0..65536) spreads rows evenly: the statement selects
    `hashtext(id::text) & 65535 >= range_start AND ... < range_end`.
    """

    ranges: int = Field(ge=1, le=4096)
    key_space: tuple[int, int] = (0, 65536)

    @model_validator(mode="after")
    def _space_fits(self) -> RangesFanout:
        low, high = self.key_space
        if high - low < self.ranges:
            raise ValueError(
                f"key_space [{low}, {high}) is too small for {self.ranges} ranges "
                "(give [low, high) with high - low >= ranges)"
            )
        return self


class QueryFanout(_Strict):
    """One unit per row of an operator-configured query (its first column, as text), run in
    the trigger's transaction. A result with more than `max_units` rows fails the trigger."""

    sql: str = Field(min_length=1)
    max_units: int = Field(100_000, ge=1, le=1_000_000)


def _fanout_kind(value: Any) -> str | None:
    keys = (
        set(value)
        if isinstance(value, dict)
        else set(type(value).model_fields)
        if isinstance(value, BaseModel)
        else set()
    )
    for kind in ("tenants", "ranges", "sql"):
        if kind in keys:
            return kind
    return None


Fanout = Annotated[
    Annotated[TenantsFanout, Tag("tenants")]
    | Annotated[RangesFanout, Tag("ranges")]
    | Annotated[QueryFanout, Tag("sql")],
    Discriminator(
        _fanout_kind,
        custom_error_type="fanout_kind",
        custom_error_message=(
            'fanout must be one of { tenants = ["a", "b"] }, { ranges = 16, key_space = '
            '[0, 65536] } or { sql = "SELECT unit FROM ..." }'
        ),
    ),
]


class ScheduleSettings(_Strict):
    """One cron schedule. Its name is part of every run key, so renaming a schedule starts a
    new history; changing its cron expression or fan-out changes only future periods."""

    name: str = Field(pattern=SCHEDULE_NAME)
    cron: str
    timezone: str = "UTC"
    handler: str
    target: dict[str, Any] | None = None
    params: dict[str, Any] = {}
    fanout: Fanout | None = None
    queue: str = "default"
    enabled: bool = True
    misfire_grace_s: float = Field(300.0, ge=0, le=7 * 86_400)
    overlap: Literal["allow", "skip", "queue"] = "skip"
    max_attempts: int | None = Field(None, ge=1)
    max_retry_age_s: int | None = Field(None, ge=0)
    priority: int = Field(0, ge=-100, le=100, strict=True)
    # None: each unit's tenant (none without one); "": no key (TOML has no null)
    concurrency_key: str | None = Field(None, max_length=200)
    on_finished: FollowUp | None = None
    # each unit's contract (docs/guides/intake-contracts.md): its deadline per attempt (not for
    # "http": a target has its own timeout_s), how long after its period's start a unit may
    # still start (then it ends dead, `expired`: a fire never runs late), and the targets
    # pushed when a unit succeeds / dies. Key modes do not apply: a unit's key is its run's.
    timeout_s: float | None = Field(None, gt=0, le=10 * 365 * 86_400)
    expires_after_s: float | None = Field(None, gt=0, le=10 * 365 * 86_400)
    on_success: dict[str, Any] | None = None
    on_failure: dict[str, Any] | None = None

    @field_validator("on_success", "on_failure")
    @classmethod
    def _callback(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and not isinstance(value.get("url"), str):
            raise ValueError('a callback is a target: { url = "https://..." }')
        return value

    @field_validator("concurrency_key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("concurrency_key may not contain U+0000 (NUL)")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        load_zone(value)
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        return parse_cron(value).expression

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(RESERVED_PAYLOAD_KEYS & set(value))
        if clash:
            raise ValueError(
                f"params may not set {clash}: the dispatcher fills those in for every unit"
            )
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                "params must be JSON values (TOML dates and times are not: quote them)"
            ) from None
        return value

    @model_validator(mode="after")
    def _target(self) -> ScheduleSettings:
        if self.handler == "http":
            if not self.target or not isinstance(self.target.get("url"), str):
                raise ValueError('handler "http" needs target = { url = "https://..." }')
        elif self.target is not None:
            raise ValueError(f'handler {self.handler!r} takes no target (only "http" does)')
        if self.handler == "http" and self.timeout_s is not None:
            raise ValueError(
                'timeout_s: an "http" unit\'s deadline is target.timeout_s; move it there'
            )
        return self

    @model_validator(mode="after")
    def _follow_up_key_free(self) -> ScheduleSettings:
        if (
            self.on_finished is not None
            and isinstance(self.fanout, TenantsFanout)
            and FOLLOW_UP_UNIT in self.fanout.tenants
        ):
            raise ValueError(
                f"tenant {FOLLOW_UP_UNIT!r} would share its key with the on_finished follow-up "
                f"(<run_key>:{FOLLOW_UP_UNIT}); rename that tenant or drop on_finished"
            )
        return self

    # derived ------------------------------------------------------------------------------
    def schedule(self) -> CronSchedule:
        return parse_cron(self.cron, self.timezone)

    def static_units(self) -> list[Unit] | None:
        """The units every period fans out to, or None when a query lists them per run."""
        if self.fanout is None:
            return [Unit("all", {})]
        if isinstance(self.fanout, TenantsFanout):
            return tenant_units(self.fanout.tenants)
        if isinstance(self.fanout, RangesFanout):
            low, high = self.fanout.key_space
            return range_units(self.fanout.ranges, low, high)
        return None

    def jobs_for(self, period_start: datetime, units: list[Unit]) -> list[NewJob]:
        """One job per unit, key `<run_key>:<unit>`: a pure function of the schedule, the
        period and the unit, so every retry of a trigger asks for exactly the same jobs."""
        if self.on_finished is not None and any(u.name == FOLLOW_UP_UNIT for u in units):
            raise PeriodError(
                f"the fan-out listed unit {FOLLOW_UP_UNIT!r}, whose key is reserved for the "
                f"on_finished follow-up of schedule {self.name!r}; rename that unit"
            )
        run = run_key(self.name, period_start)
        base = {**self.params, "schedule": self.name, "period_start": rfc3339.format(period_start)}
        # from the period, not the clock: a retried trigger asks for the same contract
        expires_at = None
        if self.expires_after_s is not None:
            expires_at = period_start + timedelta(seconds=self.expires_after_s)
        return [
            NewJob(
                key=unit_key(run, unit.name),
                handler=self.handler,
                payload={**base, "unit": unit.name, **unit.fields},
                queue=self.queue,
                tenant=unit.tenant,
                target=self.target,
                max_attempts=self.max_attempts,
                max_retry_age_s=self.max_retry_age_s,
                run_key=run,
                priority=self.priority,
                concurrency_key=self.concurrency_key,
                timeout_s=self.timeout_s,
                expires_at=expires_at,
                on_success=self.on_success,
                on_failure=self.on_failure,
            )
            for unit in units
        ]

    def follow_up_job(
        self, run: str, period_start: datetime, units: int, counts: dict[str, int]
    ) -> NewJob | None:
        """The on_finished job of a finished run (None when none is configured). `run_key` is
        left unset: the follow-up is not a unit of the run it reports on."""
        follow = self.on_finished
        if follow is None:
            return None
        payload = {
            **follow.payload,
            "schedule": self.name,
            "period_start": rfc3339.format(period_start),
            "run_key": run,
            "units": units,
            **{
                name: counts.get(name, 0)
                for name in ("succeeded", "dead", "discarded", "cancelled")
            },
        }
        return NewJob(
            key=unit_key(run, FOLLOW_UP_UNIT),
            handler=follow.handler,
            payload=payload,
            queue=follow.queue or self.queue,
            target=follow.target,
            priority=self.priority,
            concurrency_key=self.concurrency_key,
        )

    def describe_fanout(self) -> dict[str, Any]:
        if self.fanout is None:
            return {"kind": "single", "units": 1}
        if isinstance(self.fanout, TenantsFanout):
            return {"kind": "tenants", "units": len(self.fanout.tenants)}
        if isinstance(self.fanout, RangesFanout):
            return {
                "kind": "ranges",
                "units": self.fanout.ranges,
                "key_space": list(self.fanout.key_space),
            }
        return {"kind": "sql", "units": None}
