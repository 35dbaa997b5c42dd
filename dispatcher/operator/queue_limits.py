"""Queue settings changed at run time (issue 22 point 6): which settings may change, how a
change is validated, and how the settings in force are shown with where each came from.

One validation serves every door (HTTP PATCH, the CLI, the console): a change is a JSON merge
patch of the live settings, where a value sets a run-time override and null removes one. A bad
change names the field and changes nothing. An override wins over the configuration file, also
after a restart with a different file; the file's value is shown beside it, and a reset removes
every override of the queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dispatcher.config.base import MAX_BURST, MAX_RATE_PER_S
from dispatcher.config.settings import QueueSettings
from dispatcher.core import rfc3339
from dispatcher.cron.windows import MAX_WINDOWS, WindowError, parse_windows, window_state
from dispatcher.db.queue_limits import QueueSettingsRow
from dispatcher.errors import DispatcherError

# The settings a run-time change may set, in the order they are shown.
LIVE_SETTINGS = (
    "rate_per_s",
    "burst",
    "max_inflight",
    "key_max_inflight",
    "key_rate_per_s",
    "key_burst",
    "windows",
)


class SettingsChangeError(DispatcherError, ValueError):
    """A run-time change that cannot be made; `field` names the setting at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class SettingsChange(BaseModel):
    """The fields a change may carry, each optional (null removes its override). Bounds are
    those of the configuration file's [queues.NAME] (dispatcher.config.settings)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        strict=True,
        json_schema_extra={"minProperties": 1},
    )

    rate_per_s: float | None = Field(None, gt=0, le=MAX_RATE_PER_S)
    burst: int | None = Field(None, ge=1, le=MAX_BURST)
    max_inflight: int | None = Field(None, ge=1, le=100_000)
    key_max_inflight: int | None = Field(None, ge=1, le=100_000)
    key_rate_per_s: float | None = Field(None, gt=0, le=MAX_RATE_PER_S)
    key_burst: int | None = Field(None, ge=1, le=MAX_BURST)
    windows: list[str] | None = Field(None, max_length=MAX_WINDOWS)

    @field_validator("rate_per_s", "key_rate_per_s", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        # JSON has one number type: 20 is as good a rate as 20.0 (never a boolean)
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            try:
                parse_windows(value)
            except WindowError as exc:
                raise ValueError(str(exc)) from None
        return value


def parse_change(body: Any) -> dict[str, Any]:
    """The change `body` asks for: the fields it names, null for an override to remove.
    Raises SettingsChangeError naming the first field at fault."""
    if not isinstance(body, Mapping):
        raise SettingsChangeError("body", "must be a JSON object of settings to change")
    if not body:
        raise SettingsChangeError("body", f"name at least one of {', '.join(LIVE_SETTINGS)}")
    unknown = [key for key in body if key not in LIVE_SETTINGS]
    if unknown:
        raise SettingsChangeError(
            str(unknown[0]),
            f"cannot be changed at run time; the settings that can: {', '.join(LIVE_SETTINGS)}",
        )
    try:
        change = SettingsChange.model_validate(dict(body))
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        message = str(error["msg"]).removeprefix("Value error, ")
        raise SettingsChangeError(field, message) from None
    return {key: getattr(change, key) for key in body}


def check_in_force(in_force: Mapping[str, Any], change: Mapping[str, Any]) -> None:
    """Refuse a change that would leave settings that cannot work together (`in_force`: the
    settings before it, file and overrides; a removed override falls back to `file`)."""
    after = {**in_force, **{k: v for k, v in change.items() if v is not None}}
    if after.get("key_burst") is not None and after.get("key_rate_per_s") is None:
        field = "key_burst" if "key_burst" in change else "key_rate_per_s"
        raise SettingsChangeError(
            field, "key_burst is the burst of key_rate_per_s: set key_rate_per_s too"
        )


def validate_change(body: Any, current: QueueSettingsRow | None) -> dict[str, Any]:
    """`parse_change`, then `check_in_force` against queue's stored settings `current`."""
    change = parse_change(body)
    if current is not None:
        removed = {k: current.file.get(k) for k, v in change.items() if v is None}
        check_in_force({**current.effective, **removed}, change)
    return change


def file_settings(queue: QueueSettings) -> dict[str, Any]:
    """The live settings a configuration file gives a queue, as the registry stores them (a
    key rate without a burst has one second's worth)."""
    values = queue.model_dump()
    found = {key: values[key] for key in LIVE_SETTINGS if key in values}
    if "key_burst" in found:
        found["key_rate_per_s"], found["key_burst"], found["key_max_inflight"] = queue.key_limits()
    return found


def settings_view(row: QueueSettingsRow, now: datetime) -> dict[str, Any]:
    """Each live setting in force with its source ("override" or "file"; None: set nowhere)
    and the file's value beside it, and the run-window state at `now`."""
    settings = {}
    for key in LIVE_SETTINGS:
        overridden = key in row.overrides
        source = "override" if overridden else "file" if key in row.file else None
        settings[key] = {
            "value": row.effective.get(key),
            "source": source,
            "file": row.file.get(key),
        }
    problem = None
    try:
        state = window_state(parse_windows(row.effective.get("windows") or []), now)
    except WindowError as exc:  # stored by hand past every door: the daemons keep the last good
        problem, state = str(exc), window_state((), now)
    return {
        "window_error": problem,
        "settings": settings,
        "overrides_at": rfc3339.format(row.overrides_at) if row.overrides_at else None,
        "window_open": state.open,
        "window_opens_at": rfc3339.format(state.opens_at) if state.opens_at else None,
        "window_closes_at": rfc3339.format(state.closes_at) if state.closes_at else None,
    }
