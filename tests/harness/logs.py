"""A daemon's log as events to read and wait for.

A daemon under test writes one JSON object per line (`DISPATCHER_LOG_FORMAT=json` for a child
process; in process, a handler on the `dispatcher` logger formats the records the same way).
`wait_for("dispatcher ready")` returns the first event whose message contains the text and whose
fields match, and wakes as the line arrives: for a child process each time its log file grows
(checked every 20 ms: reading a local file, not asking the daemon), in process at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from dispatcher.observability.logs import JsonFormatter
from tests.harness.waits import wait_signalled

Event = dict[str, Any]


def _matches(event: Event, message: str | None, fields: dict[str, Any]) -> bool:
    if message is not None and message not in str(event.get("message", "")):
        return False
    return all(event.get(name) == value for name, value in fields.items())


class LogEvents:
    """The lines a daemon logged so far; `refresh` brings in the new ones."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changed = asyncio.Event()

    def refresh(self) -> None:
        """Read lines written since the last call (a file source; in process they arrive)."""

    def text(self) -> str:
        self.refresh()
        return "".join(line + "\n" for line in self.lines)

    def events(self, message: str | None = None, **fields: Any) -> list[Event]:
        """The JSON events so far whose message contains `message` and whose fields match
        (lines that are not JSON, such as a traceback or a text-format log, are skipped)."""
        self.refresh()
        found = []
        for line in self.lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and _matches(event, message, fields):
                found.append(event)
        return found

    async def wait_for(
        self, message: str | None = None, *, timeout_s: float = 30.0, **fields: Any
    ) -> Event:
        """The first event that matches, waiting for it up to `timeout_s`."""
        what = f"a log event {message!r} {fields or ''}".rstrip()
        found: list[Event] = []

        def seen() -> bool:
            found[:] = self.events(message, **fields)
            return bool(found)

        try:
            await wait_signalled(self.changed, seen, timeout_s, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the log ends:\n{self.text()[-3000:]}") from None
        return found[0]


class FileLog(LogEvents):
    """A child process's log file (a file, not a pipe: a chatty daemon must never block on a
    full pipe buffer while a test is not reading it)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._offset = 0
        self._partial = b""

    def refresh(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        self.lines.extend(line.decode(errors="replace") for line in complete)
        self.changed.set()

    async def wait_for(
        self, message: str | None = None, *, timeout_s: float = 30.0, **fields: Any
    ) -> Event:
        watcher = asyncio.create_task(self._watch())  # sets `changed` as the file grows
        try:
            return await super().wait_for(message, timeout_s=timeout_s, **fields)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            self.refresh()


class CapturedLog(LogEvents, logging.Handler):
    """The records of the in-process daemon's loggers, as the JSON lines a process writes."""

    def __init__(self) -> None:
        LogEvents.__init__(self)
        logging.Handler.__init__(self, logging.INFO)
        self.setFormatter(JsonFormatter())
        self._logger = logging.getLogger("dispatcher")
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.changed.set()

    def __enter__(self) -> CapturedLog:
        self._logger.addHandler(self)
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
