"""The SSRF guard: address classification, URL checks and the resolver that refuses answers."""

from __future__ import annotations

import ipaddress
import random
import socket

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from dispatcher.effects.ssrf import (
    SPECIAL_PURPOSE,
    GuardedResolver,
    TargetPolicy,
    TargetRefused,
    refusal_reason,
)

# One or more addresses in every block of the IANA IPv4 and IPv6 Special-Purpose Address
# Registries (and multicast), with a fragment of the refusal it must get.
REFUSED = {
    # IPv4
    "0.0.0.0": "unspecified",
    "0.1.2.3": "this network",
    "0.255.255.255": "this network",
    "10.1.2.3": "private",
    "100.64.0.1": "shared",
    "100.127.255.254": "shared",
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "169.254.169.254": "metadata",
    "169.254.1.1": "link-local",
    "172.16.0.1": "private",
    "172.31.255.255": "private",
    "192.0.0.1": "IETF protocol assignments",  # IPv4 service continuity (DS-Lite)
    "192.0.0.8": "IETF protocol assignments",  # dummy address
    "192.0.0.9": "anycast",  # Port Control Protocol: your own NAT gateway answers
    "192.0.0.10": "anycast",  # TURN
    "192.0.0.100": "IETF protocol assignments",
    "192.0.0.170": "IETF protocol assignments",  # NAT64/DNS64 discovery
    "192.0.0.255": "IETF protocol assignments",
    "192.0.2.1": "documentation",
    "192.31.196.1": "AS112",
    "192.52.193.1": "AMT",
    "192.88.99.1": "6to4 relay",
    "192.88.99.2": "6to4 relay",  # 6a44 relay
    "192.168.1.1": "private",
    "192.175.48.1": "AS112",
    "198.18.0.1": "benchmarking",
    "198.19.255.255": "benchmarking",
    "198.51.100.7": "documentation",
    "203.0.113.9": "documentation",
    "224.0.0.1": "multicast",
    "239.1.1.1": "multicast",
    "240.0.0.1": "reserved",
    "254.255.255.255": "reserved",
    "255.255.255.255": "broadcast",
    # IPv6
    "::": "unspecified",
    "::1": "loopback",
    "::1.2.3.4": "outside global unicast",  # deprecated IPv4-compatible form
    "::ffff:127.0.0.1": "loopback",
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "metadata",
    "::ffff:192.0.0.9": "anycast",
    "64:ff9b::a00:1": "private",  # NAT64 of 10.0.0.1
    "64:ff9b::c000:8": "IETF protocol assignments",  # NAT64 of 192.0.0.8
    "64:ff9b::7f00:1": "loopback",
    "64:ff9b:1::a00:1": "private",  # local-use NAT64 (/96 layout) of 10.0.0.1
    "64:ff9b:1:2::808:808": "local-use NAT64",  # outside the /96 layout: mapping unknown
    "64:ff9b:1:ffff::1": "local-use NAT64",
    "100::1": "discard",
    "100::ffff:ffff:ffff:ffff": "discard",
    "2001::1": "Teredo",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2": "Teredo",  # a real-world Teredo address
    "2001:1::1": "anycast",  # PCP
    "2001:1::2": "anycast",  # TURN
    "2001:1::3": "anycast",  # DNS-SD SRP
    "2001:2::1": "benchmarking",
    "2001:3::1": "AMT",
    "2001:4:112::1": "AS112",
    "2001:10::1": "ORCHID",
    "2001:20::1": "ORCHID",
    "2001:30::1": "drone",
    "2001:1ff::1": "IETF protocol assignments",
    "2001:db8::1": "documentation",
    "2001:db8:ffff::1": "documentation",
    "2002:a00:1::1": "private",  # 6to4 through 10.0.0.1
    "2002:7f00:1::1": "loopback",  # 6to4 through 127.0.0.1
    "2002:c000:9::1": "anycast",  # 6to4 through 192.0.0.9
    "2620:4f:8000::1": "AS112",
    "3fff::1": "documentation",
    "3fff:fff::1": "documentation",
    "5f00::1": "segment routing",
    "fc00::1": "private",
    "fd12:3456::1": "private",
    "fd00:ec2::254": "metadata",
    "fe80::1": "link-local",
    "febf::1": "link-local",
    "fec0::1": "site-local",
    "ff02::1": "multicast",
    "ff0e::1": "multicast",
    "4000::1": "outside global unicast",
    "8000::1": "outside global unicast",
}
PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "100.63.255.255",  # just below shared address space
    "100.128.0.0",  # just above it
    "172.15.255.255",
    "172.32.0.0",
    "192.0.1.1",
    "192.88.98.255",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "2606:4700:4700::1111",
    "2a00:1450:4001:82b::200e",
    "2001:200::1",  # just above 2001::/23
    "2003::1",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "64:ff9b:1::808:808",  # local-use NAT64 (/96 layout) of a public address
    "2002:808:808::1",  # 6to4 through 8.8.8.8
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


def test_plain_http_to_loopback_names_both_settings_at_once() -> None:
    with pytest.raises(TargetRefused) as refused:
        TargetPolicy().check_url("http://127.0.0.1:8080/hook")
    message = str(refused.value)
    assert "DISPATCHER_TARGET_ALLOW_HTTP=true" in message
    assert "DISPATCHER_TARGET_ALLOW_CIDRS=127.0.0.0/8" in message


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


def test_every_special_purpose_block_is_refused_even_if_python_calls_it_global() -> None:
    """The guard does not lean on `is_global`: these pass it on some Python versions."""
    for address in ("192.0.0.8", "192.0.0.9", "192.31.196.1", "192.175.48.1", "2001:1::1"):
        with pytest.raises(TargetRefused):
            TargetPolicy().check_address(address)


def test_no_ipv4_address_python_knows_as_non_global_slips_through() -> None:
    """The table covers at least everything the standard library marks non-global."""
    rng = random.Random(20250601)
    samples = [ipaddress.IPv4Address(rng.getrandbits(32)) for _ in range(20_000)]
    for network, _ in SPECIAL_PURPOSE:
        if network.version == 4:
            samples += [network.network_address, network.broadcast_address]
    slipped = [a for a in samples if not a.is_global and refusal_reason(a) is None]
    assert slipped == []


@pytest.mark.parametrize(
    "address", ["192.0.0.9", "::ffff:192.0.0.9", "64:ff9b::c000:9", "10.0.0.1", "::ffff:a00:1"]
)
def test_allow_list_exempts_special_purpose_blocks(address: str) -> None:
    policy = TargetPolicy(
        [ipaddress.ip_network("192.0.0.0/24"), ipaddress.ip_network("10.0.0.0/8")]
    )
    policy.check_address(address)
    with pytest.raises(TargetRefused):
        TargetPolicy([ipaddress.ip_network("192.0.2.0/24")]).check_address(address)


def test_allow_list_of_an_ipv6_block() -> None:
    policy = TargetPolicy([ipaddress.ip_network("fd00::/8")])
    policy.check_address("fd12::1")
    policy.check_url("https://[fd12::1]/hook")
    with pytest.raises(TargetRefused, match="unique-local"):
        policy.check_address("fc00::1")
