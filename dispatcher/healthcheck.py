"""The container image's HEALTHCHECK: does this daemon's own listener answer `GET /healthz`?

Run as `python -m dispatcher.healthcheck`: exit 0 when it answers 200, otherwise exit 1 with one
line saying what failed. It reads the daemon's configuration (the file and `DISPATCHER_*`
variables), so it probes wherever the daemon listens however that was set: the metrics listener
when there is one (plain HTTP, no tokens), else the API listener, over HTTPS when TLS is on. A
wildcard address (`0.0.0.0`, `::`) is probed on loopback.
"""

from __future__ import annotations

import ssl
import sys
import urllib.error
import urllib.request

from dispatcher.config.settings import Settings, host_port, load_settings
from dispatcher.errors import ConfigError

TIMEOUT_S = 2.0
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def healthz_url(settings: Settings) -> str:
    """Where the daemon with these settings answers /healthz, seen from its own host."""
    tls = settings.metrics_listen is None and settings.tls.enabled
    host, port = host_port(settings.metrics_listen or settings.listen)
    host = _WILDCARDS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}/healthz"


def probe(url: str) -> str | None:
    """None when `url` answers 200 within the timeout, else what went wrong."""
    # The daemon probing itself on loopback: its certificate names the public host, not this
    # address, and liveness is the question here, not the server's identity.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as answer:
            status: int = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:  # refused, timed out, TLS failure, bad URL
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def main() -> int:
    try:
        url = healthz_url(load_settings())
    except ConfigError as exc:
        print(f"unhealthy: configuration: {exc}", file=sys.stderr)
        return 1
    problem = probe(url)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
