"""The SSRF guard of the HTTP effect: which target URLs and addresses a job may reach.

Two checks cover every way the http effect's client (`httpclient.HttpClient`) picks the
address it connects to:

- `TargetPolicy.check_url` inspects the URL itself. A literal IP host is connected to
  directly, without asking the resolver, so literal addresses are judged here (and the client
  checks the address again before connecting).
- `GuardedResolver` wraps the resolver the client uses and refuses the whole answer when
  any address in it is disallowed. The client connects only to addresses its resolver returned,
  so the address checked is the address connected to: there is no window for DNS rebinding.

Refused unless allow-listed: every block of the IANA IPv4 and IPv6 Special-Purpose Address
Registries, multicast, and IPv6 outside global unicast (2000::/3), listed explicitly in
`SPECIAL_PURPOSE` so the policy does not shift with the Python version's `is_global`. IPv6 forms
that stand for an IPv4 address (mapped, NAT64, 6to4) are judged by that IPv4 address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

if TYPE_CHECKING:
    from dispatcher.config.settings import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# IANA IPv4 and IPv6 Special-Purpose Address Registries (2025), plus multicast and the
# deprecated IPv6 site-local block; most specific first, the first match names the refusal.
# Blocks IANA marks globally reachable are refused too: they are anycast services (PCP, TURN,
# AMT, AS112), answered by the nearest instance, which may be the operator's own NAT gateway or
# resolver, or identifiers that are not routed (ORCHIDv2, drone tags); none is a webhook
# receiver. `target_allow_cidrs` exempts any of them where really needed.
SPECIAL_PURPOSE: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(cidr), reason)
    for cidr, reason in (
        ("169.254.169.254/32", "a cloud metadata endpoint"),  # AWS, GCP, Azure, OpenStack
        ("fd00:ec2::254/128", "a cloud metadata endpoint"),  # AWS over IPv6
        ("0.0.0.0/32", "unspecified"),
        ("0.0.0.0/8", "'this network' (0.0.0.0/8)"),
        ("10.0.0.0/8", "private-use (10.0.0.0/8)"),
        ("100.64.0.0/10", "shared address space (carrier-grade NAT, 100.64.0.0/10)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private-use (172.16.0.0/12)"),
        ("192.0.0.9/32", "an anycast service address (Port Control Protocol)"),
        ("192.0.0.10/32", "an anycast service address (TURN)"),
        ("192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"),
        ("192.0.2.0/24", "documentation (TEST-NET-1)"),
        ("192.31.196.0/24", "the AS112 anycast DNS service"),
        ("192.52.193.0/24", "the AMT anycast relay service"),
        ("192.88.99.0/24", "the deprecated 6to4 relay anycast (192.88.99.0/24)"),
        ("192.168.0.0/16", "private-use (192.168.0.0/16)"),
        ("192.175.48.0/24", "the AS112 anycast DNS service (direct delegation)"),
        ("198.18.0.0/15", "benchmarking (198.18.0.0/15)"),
        ("198.51.100.0/24", "documentation (TEST-NET-2)"),
        ("203.0.113.0/24", "documentation (TEST-NET-3)"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "limited broadcast"),
        ("240.0.0.0/4", "reserved (240.0.0.0/4)"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        (
            "64:ff9b:1::/48",
            "local-use NAT64 (64:ff9b:1::/48) outside its /96 layout, whose "
            "IPv4 mapping is site-defined",
        ),
        ("100::/64", "discard-only (100::/64)"),
        ("2001::/32", "Teredo (2001::/32)"),
        ("2001:1::1/128", "an anycast service address (Port Control Protocol)"),
        ("2001:1::2/128", "an anycast service address (TURN)"),
        ("2001:1::3/128", "an anycast service address (DNS-SD service registration)"),
        ("2001:2::/48", "benchmarking (2001:2::/48)"),
        ("2001:3::/32", "the AMT anycast relay service"),
        ("2001:4:112::/48", "the AS112 anycast DNS service"),
        ("2001:10::/28", "deprecated ORCHID identifiers"),
        ("2001:20::/28", "ORCHIDv2 identifiers (not routed)"),
        ("2001:30::/28", "drone remote ID tags (not routed)"),
        ("2001::/23", "IETF protocol assignments (2001::/23)"),
        ("2001:db8::/32", "documentation (2001:db8::/32)"),
        ("2620:4f:8000::/48", "the AS112 anycast DNS service (direct delegation)"),
        ("3fff::/20", "documentation (3fff::/20)"),
        ("5f00::/16", "segment routing (SRv6) SIDs"),
        ("fc00::/7", "unique-local (private, fc00::/7)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
    )
)
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
MAPPED_PREFIX = ipaddress.ip_network("::ffff:0:0/96")
# NAT64 gateways translate these prefixes to the embedded IPv4 address (RFC 6052 /96 layout):
# the well-known prefix, and the /96 layout inside the local-use prefix 64:ff9b:1::/48, which
# DNS64 resolvers of IPv6-only networks hand out for public hosts too.
NAT64_PREFIXES = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/96"))
SIXTOFOUR_PREFIX = ipaddress.ip_network("2002::/16")


class TargetRefused(ValueError):
    """The target URL or an address it resolves to is not allowed (SSRF guard)."""


def refusal_reason(address: IPAddress) -> str | None:
    """Why `address` may not be reached (ignoring allow lists), or None if it is public."""
    if isinstance(address, ipaddress.IPv6Address):
        # Mapped and NAT64 addresses reach exactly their IPv4 address: judge that alone.
        translated = _translated_ipv4(address)
        if translated is not None:
            reason = refusal_reason(translated)
            return None if reason is None else f"a mapping of {translated}, which is {reason}"
        if address in SIXTOFOUR_PREFIX:  # routed through the embedded IPv4 address
            embedded = address.sixtofour
            reason = None if embedded is None else refusal_reason(embedded)
            if reason is not None:
                return f"6to4 and embeds {embedded}, which is {reason}"
    for network, reason in SPECIAL_PURPOSE:
        if address in network:
            return reason
    if isinstance(address, ipaddress.IPv6Address) and address not in GLOBAL_UNICAST_V6:
        return "reserved IPv6 space, outside global unicast (2000::/3)"
    return None


def _translated_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped or NAT64 address stands for."""
    if address in MAPPED_PREFIX or any(address in prefix for prefix in NAT64_PREFIXES):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """Which targets jobs may reach. An address inside `allow_cidrs` is always allowed."""

    allow_cidrs: Sequence[IPNetwork] = ()
    allow_http: bool = False

    def __post_init__(self) -> None:  # a tuple, so policies are hashable (URL checks are cached)
        object.__setattr__(self, "allow_cidrs", tuple(self.allow_cidrs))

    @classmethod
    def from_settings(cls, settings: Settings) -> TargetPolicy:
        return cls(tuple(settings.target_allow_cidrs), settings.target_allow_http)

    def check_address(self, address: str | IPAddress, *, host: str | None = None) -> None:
        """Raise TargetRefused unless connecting to `address` is allowed."""
        via = f" ({host} resolves to it)" if host is not None and host != str(address) else ""
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            raise TargetRefused(f"address {address!r}{via} is not an IP address") from None
        problem = self._address_problem(parsed, via)
        if problem is not None:
            raise TargetRefused(problem)

    def _address_problem(self, address: IPAddress, via: str = "") -> str | None:
        if self._allow_listed(address):
            return None
        reason = refusal_reason(address)
        if reason is None:
            return None
        network = "127.0.0.0/8" if address in _IPV4_LOOPBACK else str(address)
        return (
            f"address {address}{via} is {reason}; targets must be public addresses unless "
            f"target_allow_cidrs lists them (env DISPATCHER_TARGET_ALLOW_CIDRS={network})"
        )

    def check_url(self, url: str | URL) -> None:
        """Raise TargetRefused unless `url` is an allowed target (literal IPs checked here)."""
        parsed = _parse(url)
        if parsed.scheme not in ("http", "https"):
            raise TargetRefused(f"scheme {parsed.scheme!r} is not allowed: use an https:// url")
        if parsed.raw_user is not None or parsed.raw_password is not None:
            raise TargetRefused(
                "credentials in the URL are not allowed; send them in target.headers "
                "(for example Authorization)"
            )
        host = parsed.raw_host
        if not host:
            raise TargetRefused(f"url {str(parsed)!r} has no host")
        address = _literal_address(host)
        # a scheme and an address both refused are told together: one error, both settings
        problems = [self._scheme_problem(parsed)]
        if address is not None:
            problems.append(self._address_problem(address))
        told = [p for p in problems if p is not None]
        if told:
            raise TargetRefused("; and ".join(told))

    def _scheme_problem(self, url: URL) -> str | None:
        if url.scheme == "https" or (url.scheme == "http" and self.allow_http):
            return None
        if url.scheme == "http":
            return (
                "plain http is not allowed: use https (target_allow_http = true, env "
                "DISPATCHER_TARGET_ALLOW_HTTP=true, permits http, for development only)"
            )
        return f"scheme {url.scheme!r} is not allowed: use an https:// url"

    def _allow_listed(self, address: IPAddress) -> bool:
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address):
            translated = _translated_ipv4(address)
            if translated is not None:
                candidates.append(translated)
        return any(c in network for c in candidates for network in self.allow_cidrs)


def _parse(url: str | URL) -> URL:
    # The same parser aiohttp uses, so the URL checked is the URL requested.
    try:
        parsed = url if isinstance(url, URL) else URL(url)
    except (TypeError, ValueError) as exc:
        raise TargetRefused(f"url {url!r} is not a valid URL: {exc}") from None
    if not parsed.scheme:
        raise TargetRefused(f"url {str(url)!r} must be absolute, like https://host/path")
    return parsed


_IPV4_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def _literal_address(host: str) -> IPAddress | None:
    """The address of a literal-IP host, None for a name; refuses ambiguous numeric forms."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    # Forms like 2130706433 or 127.1 are addresses to the socket layer, not names.
    if ":" in host or host.replace(".", "").isdigit():
        raise TargetRefused(f"host {host!r} is not a canonical IP address or a host name")
    return None


class GuardedResolver(AbstractResolver):
    """Resolves with an inner resolver and refuses any answer holding a disallowed address.

    Refusal raises TargetRefused (a ValueError, not an OSError) so it is never mistaken for a
    transient DNS failure. The inner resolver defaults to aiohttp's DefaultResolver, which
    needs a running event loop: build this inside one.
    """

    def __init__(self, policy: TargetPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            self._policy.check_address(result["host"], host=host)
        return results

    async def close(self) -> None:
        await self._inner.close()
