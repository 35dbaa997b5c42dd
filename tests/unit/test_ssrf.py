"""The SSRF guard: address classification, URL checks and the resolver that refuses answers."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from dispatcher.effects.ssrf import GuardedResolver, TargetPolicy, TargetRefused, refusal_reason

REFUSED = {
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "169.254.169.254": "metadata",
    "fd00:ec2::254": "metadata",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "224.0.0.1": "multicast",
    "239.1.1.1": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "reserved",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "100.64.0.1": "shared",
    "100.127.255.254": "shared",
    "fec0::1": "site-local",
    "255.255.255.255": "reserved",
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "metadata",
    "64:ff9b::a00:1": "private",  # NAT64 of 10.0.0.1
    "2002:a00:1::1": "private",  # 6to4 through 10.0.0.1
}
PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
]


@pytest.mark.parametrize(("address", "kind"), REFUSED.items())
def test_refused_addresses_name_their_kind(address: str, kind: str) -> None:
    reason = refusal_reason(ipaddress.ip_address(address))
    assert reason is not None
    assert kind in reason


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None
    TargetPolicy().check_address(address)


def test_allow_list_overrides_refusal_including_mapped_form() -> None:
    policy = TargetPolicy([ipaddress.ip_network("127.0.0.0/8")])
    policy.check_address("127.0.0.1")
    policy.check_address("::ffff:127.0.0.1")
    with pytest.raises(TargetRefused, match="loopback"):
        policy.check_address("::1")
    with pytest.raises(TargetRefused, match="private"):
        policy.check_address("10.0.0.1")


def test_check_address_names_the_host_that_resolved_to_it() -> None:
    with pytest.raises(TargetRefused, match=r"10\.0\.0\.7 \(internal\.example resolves to it\)"):
        TargetPolicy().check_address("10.0.0.7", host="internal.example")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://example.com/", "plain http is not allowed"),
        ("ftp://example.com/", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("https://user:pw@example.com/", "credentials"),
        ("https://user@example.com/", "credentials"),
        ("/relative/path", "must be absolute"),
        ("https://169.254.169.254/latest/meta-data/", "metadata"),
        ("https://10.0.0.1/", "private"),
        ("https://[::1]:8443/", "loopback"),
        ("https://[::ffff:127.0.0.1]/", "loopback"),
        ("https://0.0.0.0/", "unspecified"),
        ("https://2130706433/", "canonical"),
        ("https://127.1/", "canonical"),
        ("https://017700000001/", "canonical"),
    ],
)
def test_check_url_refuses(url: str, message: str) -> None:
    with pytest.raises(TargetRefused, match=message):
        TargetPolicy().check_url(url)


@pytest.mark.parametrize(
    "url", ["https://example.com/hook", "https://8.8.8.8/x?y=1", "https://[2606:4700::1]/"]
)
def test_check_url_allows_public_https(url: str) -> None:
    TargetPolicy().check_url(url)


def test_check_url_leaves_names_to_the_resolver() -> None:
    # A name's addresses are only known at connect time; the resolver judges them.
    TargetPolicy().check_url("https://localhost/")


def test_plain_http_needs_allow_http() -> None:
    policy = TargetPolicy([ipaddress.ip_network("127.0.0.0/8")], allow_http=True)
    policy.check_url("http://127.0.0.1:8080/")
    with pytest.raises(TargetRefused, match="loopback"):
        TargetPolicy(allow_http=True).check_url("http://127.0.0.1:8080/")


class FixedResolver(AbstractResolver):
    """Answers every name with fixed addresses (stands in for DNS, including rebinding)."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                proto=0,
                flags=0,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
            )
            for a in self.addresses
        ]

    async def close(self) -> None:
        pass


async def test_resolver_refuses_if_any_address_is_disallowed() -> None:
    resolver = GuardedResolver(TargetPolicy(), FixedResolver(["8.8.8.8", "10.0.0.5"]))
    with pytest.raises(TargetRefused, match=r"10\.0\.0\.5 \(evil\.example resolves to it\)"):
        await resolver.resolve("evil.example", 443)


async def test_resolver_passes_public_answers_through() -> None:
    resolver = GuardedResolver(TargetPolicy(), FixedResolver(["8.8.8.8", "2606:4700::1"]))
    results = await resolver.resolve("good.example", 443)
    assert [r["host"] for r in results] == ["8.8.8.8", "2606:4700::1"]


async def test_resolver_refuses_localhost_by_its_real_resolution() -> None:
    resolver = GuardedResolver(TargetPolicy())
    with pytest.raises(TargetRefused, match="loopback"):
        await resolver.resolve("localhost", 80, socket.AF_UNSPEC)
    await resolver.close()


async def test_resolver_allows_allow_listed_answers() -> None:
    policy = TargetPolicy([ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")])
    resolver = GuardedResolver(policy)
    results = await resolver.resolve("localhost", 80, socket.AF_UNSPEC)
    assert results
    await resolver.close()
