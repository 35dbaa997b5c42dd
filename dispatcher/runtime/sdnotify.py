"""systemd service notifications (the sd_notify protocol) without libsystemd.

A notification is one datagram of `KEY=value` lines sent to the unix socket named by
`$NOTIFY_SOCKET`; a name starting with `@` is in the abstract namespace. Outside systemd the
variable is unset and every call here is a no-op, so the daemon calls these unconditionally:
`READY=1` once it serves, `STOPPING=1` when it starts to drain, and `WATCHDOG=1` from a
`Watchdog` service while the event loop is healthy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

READY = "READY=1"
STOPPING = "STOPPING=1"
WATCHDOG = "WATCHDOG=1"


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send `message` to the service manager; False when there is none or the send failed.

    Never raises: a lost notification must not take the daemon down (systemd's own timeouts
    report a service that never became ready).
    """
    environ = os.environ if environ is None else environ
    address = _socket_address(environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.warning("sd_notify %r failed: %s", message.split("=", 1)[0], exc)
        return False
    return True


def _socket_address(raw: str) -> str | None:
    if raw.startswith("@"):
        return "\0" + raw[1:]  # abstract namespace: a leading NUL instead of the '@'
    if raw.startswith("/"):
        return raw
    if raw:
        log.warning("NOTIFY_SOCKET=%r is not a unix socket path; notifications disabled", raw)
    return None


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, or None when not watched.

    `$WATCHDOG_PID`, when set, names the process the watchdog is meant for; any other process
    (a child that inherited the environment) must not ping.
    """
    environ = os.environ if environ is None else environ
    try:
        period_us = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if period_us <= 0:
        return None
    owner = environ.get("WATCHDOG_PID", "")
    if owner and owner != str(os.getpid()):
        return None
    return period_us / 2_000_000


class Watchdog:
    """Sends `WATCHDOG=1` every `interval_s` from a task on the event loop.

    Pinging from the loop itself (not a thread) is the point: if the loop stops turning, the
    pings stop and systemd restarts the service. Inert when there is no interval (not under a
    watchdog). `start()` sends the first ping before it returns; `stop()` is idempotent.
    """

    def __init__(
        self,
        interval_s: float | None = None,
        send: Callable[[str], bool] = notify,
    ) -> None:
        self.interval_s = watchdog_interval_s() if interval_s is None else interval_s
        self._send = send
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self._task is not None or not self.interval_s:
            return
        self._send(WATCHDOG)
        self._task = asyncio.create_task(self._run(self.interval_s), name="sd-watchdog")
        log.info("systemd watchdog: pinging every %.1f s", self.interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        # wait() rather than `await task`: our own cancellation still propagates, the task's doesn't
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            log.error("systemd watchdog task failed", exc_info=task.exception())

    async def _run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self._send(WATCHDOG)
