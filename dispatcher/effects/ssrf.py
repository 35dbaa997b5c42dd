"""The SSRF guard of the HTTP effect: which target URLs and addresses a job may reach.

Two checks cover every way aiohttp picks the address it connects to:

- `TargetPolicy.check_url` inspects the URL itself. aiohttp connects to a literal IP host
  directly, without asking the resolver, so literal addresses are judged here.
- `GuardedResolver` wraps the resolver the connector uses and refuses the whole answer when
  any address in it is disallowed. aiohttp connects only to addresses its resolver returned,
  so the address checked is the address connected to: there is no window for DNS rebinding.

Refused unless allow-listed: loopback, private, link-local (cloud metadata lives there),
multicast, reserved, unspecified, shared (100.64.0.0/10), site-local and any other address that
is not globally routable, including IPv6 forms that embed such an IPv4 address.
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
    from dispatcher.config import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES = {
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack
    ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
}
SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")
# NAT64 gateways translate this prefix to the embedded IPv4 address.
NAT64_PREFIX = ipaddress.ip_network("64:ff9b::/96")

# Checked in order; the first that applies names the refusal.
_CATEGORIES = (
    ("is_unspecified", "unspecified"),
    ("is_loopback", "loopback"),
    ("is_link_local", "link-local"),
    ("is_multicast", "multicast"),
    ("is_reserved", "reserved"),
    ("is_private", "private"),
)


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
        for embedded in _tunnelled_ipv4(address):
            reason = refusal_reason(embedded)
            if reason is not None:
                return f"embeds {embedded}, which is {reason}"
    if address in METADATA_ADDRESSES:
        return "a cloud metadata endpoint"
    if address in SHARED_ADDRESS_SPACE:
        return "shared address space (carrier-grade NAT)"
    for attribute, name in _CATEGORIES:
        if getattr(address, attribute):
            return name
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "site-local"
    if not address.is_global:
        return "not globally routable"
    return None


def _translated_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped or NAT64 address stands for."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64_PREFIX:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _tunnelled_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """IPv4 endpoints a 6to4 or Teredo address would route through."""
    found = []
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return found


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
        if self._allow_listed(parsed):
            return
        reason = refusal_reason(parsed)
        if reason is not None:
            raise TargetRefused(
                f"address {parsed}{via} is {reason}; targets must be public addresses "
                "unless target_allow_cidrs lists them"
            )

    def check_url(self, url: str | URL) -> None:
        """Raise TargetRefused unless `url` is an allowed target (literal IPs checked here)."""
        parsed = _parse(url)
        self._check_scheme(parsed)
        if parsed.raw_user is not None or parsed.raw_password is not None:
            raise TargetRefused(
                "credentials in the URL are not allowed; send them in target.headers "
                "(for example Authorization)"
            )
        host = parsed.raw_host
        if not host:
            raise TargetRefused(f"url {str(parsed)!r} has no host")
        address = _literal_address(host)
        if address is not None:
            self.check_address(address)

    def _check_scheme(self, url: URL) -> None:
        if url.scheme == "https" or (url.scheme == "http" and self.allow_http):
            return
        if url.scheme == "http":
            raise TargetRefused(
                "plain http is not allowed: use https (target_allow_http = true permits http, "
                "for development only)"
            )
        raise TargetRefused(f"scheme {url.scheme!r} is not allowed: use an https:// url")

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
