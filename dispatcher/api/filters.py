"""The operator's job filters, validated once for both doors (GET /v1/jobs and `dispatcher jobs
list`): each value is checked before it reaches the database, and a bad one is refused with its
name and the form it must take."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.api.schemas import idempotency_key, valid_key
from dispatcher.config.settings import NAME_PATTERN
from dispatcher.core import rfc3339
from dispatcher.intake.requests import storable_text
from dispatcher.model import STATES, JobFilter, JobPage, ListCursor

# The filters, in the order the API and the CLI document them.
FILTERS = (
    "state",
    "queue",
    "key",
    "tenant",
    "run_key",
    "handler",
    "due_before",
    "due_after",
    "priority",
    "reason",
    "key_prefix",
    "error",
    "concurrency_key",
)
PRIORITY = re.compile(r"-?[0-9]{1,3}\Z")
MAX_TENANT = 255  # as intake accepts it
MAX_REASON = 200  # as the dead-letter bulk calls accept it
MAX_CONCURRENCY_KEY = 200  # as intake accepts it
# Text searched for in the last error: the trigram index (migration 039) finds a piece of at
# least three characters; a shorter one would match most errors and read the whole index.
ERROR_TEXT = (3, 200)


class FilterError(ValueError):
    """A filter value that cannot match as given; the message starts with the filter's name."""


def parse_job_filter(values: Mapping[str, str | None]) -> JobFilter:
    """A `JobFilter` from raw text values; absent or empty values filter nothing."""
    given = {name: values.get(name) or None for name in FILTERS}
    state = given["state"]
    if state is not None and state not in STATES:
        raise FilterError(f"state: must be one of {', '.join(STATES)}")
    queue = given["queue"]
    if queue is not None and not valid_key(queue):  # printable ASCII: no NUL reaches the database
        raise FilterError("queue: a queue name from the configuration")
    key = given["key"]
    if key is not None and (key := idempotency_key(key)) is None:
        raise FilterError("key: an idempotency key, 1 to 255 printable ASCII characters")
    handler = given["handler"]
    if handler is not None and not re.match(NAME_PATTERN, handler):
        raise FilterError(
            f'handler: "http" or a handler name from the configuration ({NAME_PATTERN})'
        )
    run_key = given["run_key"]
    if run_key is not None and not valid_key(run_key):
        raise FilterError(
            "run_key: a run key such as nightly:2026-05-31T02:00:00Z, 1 to 255 printable ASCII"
        )
    due_before = _instant("due_before", given["due_before"])
    due_after = _instant("due_after", given["due_after"])
    if due_before is not None and due_after is not None and due_after >= due_before:
        raise FilterError(
            "due_after: must be earlier than due_before (the window is [due_after, due_before))"
        )
    return JobFilter(
        state=state,
        queue=queue,
        key=key,
        tenant=_tenant(given["tenant"]),
        run_key=run_key,
        handler=handler,
        due_before=due_before,
        due_after=due_after,
        priority=_priority(given["priority"]),
        dead_reason=_reason(given["reason"]),
        key_prefix=_key_prefix(given["key_prefix"]),
        error=_error_text(given["error"]),
        concurrency_key=_concurrency_key(given["concurrency_key"]),
    )


def _key_prefix(value: str | None) -> str | None:
    """The start of an idempotency key, taken as typed (no wildcards, no trimming)."""
    if value is not None and not valid_key(value):
        raise FilterError(
            "key_prefix: the start of an idempotency key, 1 to 255 printable ASCII characters "
            "(% and _ match themselves)"
        )
    return value


def _error_text(value: str | None) -> str | None:
    """A piece of a last error, any case."""
    if value is None:
        return None
    low, high = ERROR_TEXT
    why = storable_text(value)
    if why or not low <= len(value) <= high:
        raise FilterError(
            f"error: {low} to {high} characters of text found anywhere in the job's last error, "
            f"any case (% and _ match themselves)" + (f" ({why})" if why else "")
        )
    return value


def _concurrency_key(value: str | None) -> str | None:
    """A concurrency key, exact (a job accepted without one is keyed by its tenant)."""
    if value is not None and (len(value) > MAX_CONCURRENCY_KEY or (why := storable_text(value))):
        raise FilterError(
            f"concurrency_key: a concurrency key, exact, at most {MAX_CONCURRENCY_KEY} "
            "characters of text" + ("" if len(value) > MAX_CONCURRENCY_KEY else f" ({why})")
        )
    return value


def _priority(value: str | None) -> int | None:
    if value is None:
        return None
    if not PRIORITY.match(value) or not -100 <= int(value) <= 100:
        raise FilterError("priority: an integer from -100 to 100, e.g. -10")
    return int(value)


def _reason(value: str | None) -> str | None:
    """A dead reason, exact (as the dead-letter page groups them)."""
    if value is not None and (len(value) > MAX_REASON or (why := storable_text(value))):
        raise FilterError(
            f"reason: a dead reason as the dead-letter page shows it, at most {MAX_REASON} "
            f"characters of text" + ("" if len(value) > MAX_REASON else f" ({why})")
        )
    return value


def _tenant(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > MAX_TENANT:
        raise FilterError(f"tenant: at most {MAX_TENANT} characters")
    if "\x00" in value:
        raise FilterError("tenant: may not contain U+0000 (NUL)")
    # A percent-escape that is not UTF-8 reaches the API as U+FFFD, and a command-line argument
    # that is not as a lone surrogate: either way the bytes meant some other tenant.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise FilterError("tenant: must be UTF-8 text") from None
    if "\ufffd" in value:
        raise FilterError("tenant: must be UTF-8 text (percent-escapes must encode UTF-8)")
    return value


def _instant(name: str, value: str | None) -> datetime | None:
    """An RFC 3339 time with offset, as UTC. Any such time is a valid bound (one before any
    stored due time matches everything after it), as long as it exists in UTC."""
    if value is None:
        return None
    fix = f"{name}: an RFC 3339 time with offset, e.g. 2026-05-31T02:00:00Z"
    if not rfc3339.PATTERN.match(value):
        raise FilterError(fix)
    try:
        return rfc3339.parse(value).astimezone(UTC)
    except rfc3339.TimeError:
        raise FilterError(f"{fix} (no such date or time)") from None
    except OverflowError:
        raise FilterError(
            f"{name}: out of range; use a time from 0001-01-01 to 9999-12-31 UTC"
        ) from None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_ID_CURSOR = re.compile(r"[0-9]{1,18}\Z")
_DUE_CURSOR = re.compile(r"([0-9]{1,18})\.([0-9]{1,18})\Z")


def next_cursor(row: Mapping[str, Any], filters: JobFilter) -> str:
    """The cursor after `row`, the last of a full page: its id, and in a due window its due
    time first (microseconds since 1970), e.g. `1748656800000000.4711`."""
    if filters.by_due:
        return f"{(row['due_at'] - _EPOCH) // _MICROSECOND}.{row['id']}"
    return str(row["id"])


def page_cursor(page: JobPage, filters: JobFilter, limit: int) -> str | None:
    """Where the list continues after `page`: after its last row when it is full; below the
    ids it looked at when a bounded search stopped there (the cursor to search older jobs);
    None when the list is done."""
    if len(page.rows) == limit:
        return next_cursor(page.rows[-1], filters)
    if page.searched is not None:
        return str(page.searched.oldest)  # the ids below it; the same form as a row's cursor
    return None


def parse_cursor(text: str | None, filters: JobFilter) -> ListCursor | None:
    """The position `next_cursor` wrote; a cursor of the other order is refused, since it
    would silently skip or repeat jobs."""
    if not text:
        return None
    fix = "cursor: pass the next_cursor of the previous page, with the same filters"
    if filters.by_due:
        match = _DUE_CURSOR.match(text)
        if match is None:
            raise FilterError(fix)
        try:
            due_at = _EPOCH + int(match.group(1)) * _MICROSECOND
        except OverflowError:
            raise FilterError(fix) from None
        return ListCursor(int(match.group(2)), due_at)
    if not _ID_CURSOR.match(text):
        raise FilterError(fix)
    return ListCursor(int(text))
