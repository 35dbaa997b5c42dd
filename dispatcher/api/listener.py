"""An HTTP listener as a service: binds an aiohttp application on `host:port`, stops it cleanly."""

from __future__ import annotations

import errno
import socket
import ssl

from aiohttp import web

from dispatcher.api.app import ProblemAppRunner
from dispatcher.config.settings import host_port
from dispatcher.errors import ConfigError
from dispatcher.runtime.lifecycle import Service

SHUTDOWN_TIMEOUT_S = 5.0


def check_can_listen(listen: str, setting: str) -> None:
    """Fail with one line naming the address and the setting if `listen` cannot be bound, before
    anything else starts (the listener binds again for real later; this only checks early)."""
    host, port = host_port(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
                probe.bind(address)
    except OSError as exc:
        raise ConfigError(_cannot_listen(listen, setting, exc)) from None


def _cannot_listen(listen: str, setting: str, exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    hint = "another process may use that port; stop it or set"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        hint = "that address is not one of this host's; set"
    return f"cannot listen on {listen} ({reason}): {hint} {setting} to a free host:port"


class HttpListener(Service):
    """The daemon owns signals, so aiohttp must not install handlers. `stop()` stops accepting,
    lets requests in progress finish for up to `SHUTDOWN_TIMEOUT_S`, then closes."""

    stop_timeout_s = SHUTDOWN_TIMEOUT_S + 5

    def __init__(
        self,
        name: str,
        app: web.Application,
        listen: str,
        setting: str,
        tls: ssl.SSLContext | None = None,
    ):
        self.name = name
        self._app = app
        self._tls = tls
        self._listen = listen
        self._setting = setting
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        # keepalive_timeout also bounds a connection that never finishes its headers (aiohttp
        # has no separate header timeout), so slow-loris clients are dropped after it.
        runner = ProblemAppRunner(
            self._app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            keepalive_timeout=75,
        )
        await runner.setup()
        host, port = host_port(self._listen)
        try:
            await web.TCPSite(runner, host, port, backlog=1024, ssl_context=self._tls).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(_cannot_listen(self._listen, self._setting, exc)) from None
        self._runner = runner

    async def stop(self) -> None:
        self._stopping = True
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
