"""The listeners' rules: `host:port` addresses, what counts as loopback, the `[tls]` section and
how strong a token must be beyond loopback."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import model_validator

from dispatcher.config.base import Strict
from dispatcher.config.tokens import ApiToken


class TlsSettings(Strict):
    """TLS on the API listener (TLS 1.2 and newer). Both files or neither; SIGHUP reloads them."""

    cert_file: Path | None = None  # PEM: the certificate, then any intermediates
    key_file: Path | None = None  # PEM private key (unencrypted)

    @model_validator(mode="after")
    def _both_readable(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls needs both cert_file and key_file (or neither)")
        for name in ("cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"tls.{name} = {str(path)!r} is not a readable file")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


MIN_TOKEN_CHARS = 32


def check_token_strength(tokens: list[ApiToken]) -> None:
    """Off loopback, a token must be long enough that guessing it is hopeless (at the 429
    limit of 10 a minute, even a 32-character hex token takes longer than the universe)."""
    short = [t.where for t in tokens if len(t.secret) < MIN_TOKEN_CHARS]
    if short:
        raise ValueError(
            f"{', '.join(short)}: API tokens must be at least {MIN_TOKEN_CHARS} characters "
            "when the API or console listens beyond loopback; generate one with: python3 -c "
            "'import secrets; print(secrets.token_urlsafe(32))'"
        )


def host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} must be host:port, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
