"""TLS for the API listener: one server context (TLS 1.2 and newer), reloadable in place.

Reloading loads the new certificate into the same `SSLContext` the listening socket uses, so new
handshakes get it while the listener (and connections already open) stay up. The files are first
loaded into a scratch context: a bad pair is refused with the current certificate kept.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

from dispatcher.errors import ConfigError

log = logging.getLogger(__name__)


class ServerTls:
    def __init__(self, cert_file: Path, key_file: Path):
        self._cert_file = cert_file
        self._key_file = key_file
        self.context = _new_context()
        try:
            self.context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"tls: cannot load cert_file {str(cert_file)!r} with key_file "
                f"{str(key_file)!r}: {exc}; both must be PEM and belong together"
            ) from None

    def reload(self) -> bool:
        """Load the files again (after a renewal); False (and the old certificate kept) if the
        new pair does not load."""
        try:
            _new_context().load_cert_chain(self._cert_file, self._key_file)
            self.context.load_cert_chain(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS reload failed, still serving the previous certificate: %s", exc)
            return False
        log.info("TLS certificate reloaded from %s", self._cert_file)
        return True


def _new_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
