"""RFC 3339 times, the one way every door reads and writes them.

- `parse` reads text that carries its offset (`Z` or `+hh:mm`): a time without one is refused,
  since "02:00" means a different instant on every server.
- `utc` takes a `datetime` from anywhere else (a Python caller, a driver) to UTC, refusing a
  naive one for the same reason.
- `format` writes an instant as UTC with a `Z` (`2026-05-31T02:00:00Z`, microseconds only when
  there are any), in API responses, CLI output, logs and run keys alike.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import TypeAdapter, ValidationError

EXAMPLE = "2026-05-31T00:00:00Z"
# `\Z`, not `$` (which also matches before a final newline); [0-9], not `\d` (any script's digits)
PATTERN = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)
_DATETIME = TypeAdapter(datetime)


class TimeError(ValueError):
    """Not an RFC 3339 time with an offset, or no instant in UTC; the message names the fix."""


def parse(text: object) -> datetime:
    """The instant `text` names, keeping its offset."""
    if not isinstance(text, str) or not PATTERN.match(text):
        raise TimeError(f"must be an RFC 3339 timestamp with offset, e.g. {EXAMPLE}")
    try:
        return _DATETIME.validate_python(text)
    except ValidationError:
        raise TimeError(f"{text!r} is no such date or time, e.g. {EXAMPLE}") from None


def utc(instant: datetime) -> datetime:
    """`instant` in UTC; a naive one, or one before the calendar in UTC, is refused."""
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise TimeError(f"{instant.isoformat()} has no UTC offset; give times with one")
    try:
        return instant.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+14:00 lies in year 0 in UTC
        raise TimeError(f"{instant.isoformat()} is out of range in UTC") from None


def format(instant: datetime) -> str:  # read as rfc3339.format
    """`instant` as RFC 3339 in UTC with `Z`."""
    return utc(instant).isoformat().removesuffix("+00:00") + "Z"
