"""Logging: one JSON object per line (or readable text on a terminal).

Job fields (`job_id`, `job_key`, `queue`, `attempt`, `run_key`) travel in `extra=` and appear on
every line about a job. Payloads and secrets are never passed to the logger. While tracing is
on, a line written inside a span (an intake request, an attempt) also carries its `trace_id`.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime

FIELDS = (
    "job_id",
    "job_key",
    "queue",
    "attempt",
    "run_key",
    "state",
    "schedule",
    "token",
    "actor",
    "door",
    "trace_id",
)
# Set while tracing is on (`with_trace_ids`): the current span's trace id, or None outside one.
_current_trace_id: Callable[[], str | None] | None = None


def with_trace_ids(current_trace_id: Callable[[], str | None] | None) -> None:
    """Add the current trace id to every line (None: stop). Only a traced daemon sets it, so
    untraced processes never look a span up (nor import OpenTelemetry for it)."""
    global _current_trace_id
    _current_trace_id = current_trace_id


def _fields(record: logging.LogRecord) -> dict[str, object]:
    values = record.__dict__
    found = {name: values[name] for name in FIELDS if values.get(name) is not None}
    if _current_trace_id is not None and "trace_id" not in found:
        trace_id = _current_trace_id()
        if trace_id is not None:
            found["trace_id"] = trace_id
    return found


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{name}={value}" for name, value in _fields(record).items())
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()}"
        if fields:
            line += f"  [{fields}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str = "INFO", fmt: str = "auto") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("apscheduler", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
