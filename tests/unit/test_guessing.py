"""The per-address count of failed authentications (dispatcher.api.guessing): windows, the
bound on its memory, IPv6 /64s, and which address X-Forwarded-For may name. Injected clock."""

from __future__ import annotations

import ipaddress
import logging

import pytest

from dispatcher.api.guessing import GuessLimiter, client_address, client_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_refused_after_the_limit_until_its_window_ends() -> None:
    clock = Clock()
    limiter = GuessLimiter(3, 60, clock=clock)
    for _ in range(2):
        limiter.failed("192.0.2.1", "bearer token")
    assert limiter.retry_after_s("192.0.2.1") is None
    limiter.failed("192.0.2.1", "bearer token")
    assert limiter.retry_after_s("192.0.2.1") == 60
    assert limiter.retry_after_s("192.0.2.2") is None
    clock.now += 59.5
    assert limiter.retry_after_s("192.0.2.1") == 1
    clock.now += 0.5
    assert limiter.retry_after_s("192.0.2.1") is None  # a new window, counted from zero
    limiter.failed("192.0.2.1", "bearer token")
    assert limiter.retry_after_s("192.0.2.1") is None


def test_a_burst_is_logged_twice_whatever_its_size(caplog: pytest.LogCaptureFixture) -> None:
    limiter = GuessLimiter(10, 60, clock=Clock())
    with caplog.at_level(logging.WARNING, "dispatcher.api.guessing"):
        for _ in range(300):
            if limiter.retry_after_s("192.0.2.1") is None:
                limiter.failed("192.0.2.1", "console sign-in")
    assert len(caplog.records) == 2
    assert "refusing it with 429 for 60 s" in caplog.records[1].getMessage()


def test_many_addresses_cannot_grow_the_table_past_its_bound() -> None:
    clock = Clock()
    limiter = GuessLimiter(5, 60, max_addresses=1000, clock=clock)
    for n in range(50_000):
        limiter.failed(str(ipaddress.IPv4Address(0x0A000000 + n)), "bearer token")
        clock.now += 0.0001
    assert len(limiter) == 1000
    clock.now += 61
    limiter.failed("192.0.2.1", "bearer token")
    assert len(limiter) == 1  # expired windows go first


def test_an_ipv6_client_counts_as_its_64() -> None:
    limiter = GuessLimiter(3, 60, clock=Clock())
    for host in range(3):
        limiter.failed(f"2001:db8:1:2::{host + 1:x}", "bearer token")
    assert limiter.retry_after_s("2001:db8:1:2:ffff::9") == 60
    assert limiter.retry_after_s("2001:db8:1:3::1") is None
    assert client_key("::ffff:192.0.2.7") == "192.0.2.7"


TRUSTED = [ipaddress.ip_network("10.0.0.0/8")]


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "client"),
    [
        ("192.0.2.1", "203.0.113.9", [], "192.0.2.1"),  # no trusted proxies: the peer
        ("192.0.2.1", "203.0.113.9", TRUSTED, "192.0.2.1"),  # the peer is not a proxy
        ("10.0.0.5", "203.0.113.9", TRUSTED, "203.0.113.9"),
        ("10.0.0.5", "198.51.100.1, 203.0.113.9, 10.0.0.4", TRUSTED, "203.0.113.9"),
        ("10.0.0.5", "not-an-address", TRUSTED, "10.0.0.5"),
        ("10.0.0.5", "10.1.1.1", TRUSTED, "10.0.0.5"),  # only proxies: the peer
        (None, "203.0.113.9", TRUSTED, "unknown"),
    ],
)
def test_x_forwarded_for_is_read_only_from_a_trusted_proxy(
    peer: str | None, forwarded: str, trusted: list[ipaddress.IPv4Network], client: str
) -> None:
    assert client_address(peer, forwarded, trusted) == client
