"""Slowing down token guessing: failed authentications counted per client address.

A wrong bearer token (the API) or a wrong token in the console's sign-in form counts as one
failure of the address it came from. After `limit` failures within `window_s` of the first,
that address is refused with 429 and `Retry-After` until the window ends: every attempt, right
token or wrong (letting a right one through would let guessing go on), while other addresses
are untouched. A success resets nothing, not even its own address's count: an attacker holding
one weak-scoped token must not be able to clear the count it guesses a stronger one with.

A burst is logged twice at most, whatever its size: its first failure and the moment the
address is refused; the attempts between and after are counted, not logged.

Memory is bounded: at most `max_addresses` windows are kept (about 200 bytes each). An IPv6
client counts as its /64 (one host usually has a whole /64 to pick addresses from). When the
table is full, expired windows go first, then the oldest one: a client with thousands of
addresses can make the limiter forget an address, never grow it.

The client is the socket's peer. X-Forwarded-For is read only when the peer is one of
`trusted_proxies`: then the client is the right-most address in it that is not a trusted proxy.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dispatcher.observability import metrics

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_ADDRESSES = 10_000
UNKNOWN = "unknown"  # a peer without an address (a Unix socket): all such count as one


@dataclass(slots=True)
class _Window:
    started: float
    failures: int = 0


class GuessLimiter:
    """Failures per client address in fixed windows; see the module docstring."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit = limit
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._clock = clock
        # in order of window start, so also of window end: the front expires first
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def __len__(self) -> int:
        return len(self._windows)

    def retry_after_s(self, client: str) -> int | None:
        """Whole seconds until `client` may try again, or None when it may now."""
        window = self._current(client_key(client))
        if window is None or window.failures < self.limit:
            return None
        metrics.AUTH_REFUSED.inc()
        return self._remaining_s(window)

    def failed(self, client: str, what: str) -> None:
        """Count a failed authentication (`what`: e.g. 'bearer token') of `client`."""
        metrics.AUTH_FAILURES.labels(what).inc()
        key = client_key(client)
        window = self._current(key)
        if window is None:
            window = self._open(key)
            log.warning(
                "%s refused from %s; further failures from it within %g s are counted, not "
                "logged, and after %d it is refused with 429 until then",
                what, client, self.window_s, self.limit,
            )  # fmt: skip
        window.failures += 1
        if window.failures == self.limit:
            log.warning(
                "%d failed authentications from %s within %.1f s (last: %s): refusing it "
                "with 429 for %d s",
                self.limit, client, self._clock() - window.started, what,
                self._remaining_s(window),
            )  # fmt: skip

    def _current(self, key: str) -> _Window | None:
        window = self._windows.get(key)
        if window is not None and self._expired(window):
            del self._windows[key]
            return None
        return window

    def _open(self, key: str) -> _Window:
        while self._windows and self._expired(next(iter(self._windows.values()))):
            self._windows.popitem(last=False)
        while len(self._windows) >= self.max_addresses:
            self._windows.popitem(last=False)  # the oldest window: the first to end anyway
        window = self._windows[key] = _Window(self._clock())
        return window

    def _remaining_s(self, window: _Window) -> int:
        return max(1, math.ceil(window.started + self.window_s - self._clock()))

    def _expired(self, window: _Window) -> bool:
        return self._clock() >= window.started + self.window_s


def client_key(client: str) -> str:
    """What failures are counted by: the address, an IPv6 address's /64."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def client_address(peer: str | None, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The client's address: the socket peer, or, when the peer is a trusted proxy, the
    right-most address of X-Forwarded-For that is not a trusted proxy."""
    if peer is None:
        return UNKNOWN
    if not trusted or not forwarded_for or not _within(peer, trusted):
        return peer
    for hop in reversed([part.strip() for part in forwarded_for.split(",")]):
        if not _within(hop, trusted):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # a malformed hop: no address further left can be trusted
    return peer


def _within(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)
