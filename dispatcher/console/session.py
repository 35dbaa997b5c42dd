"""Console sign-in: a signed session cookie standing for one API token, and CSRF tokens.

A signed cookie alone cannot be taken back, so every session of a token also has a row on the
server (dispatcher.db.sessions, keyed by `id_hash`): the console accepts a cookie only while
its row exists, and signing out, `dispatcher console sessions revoke` and removing the token
delete it. This module checks the cookie itself; dispatcher.console.web asks the database.

A session is `EXPIRES.SESSION_ID.TOKEN_ID.SIGNATURE` (all ASCII, cookie-safe): the expiry (Unix
seconds), a random id, which configured token signed in (an HMAC of the token's digest, never
the token or its digest), and an HMAC-SHA256 over the rest. The token's name and scopes are
looked up in the configuration on every request, so a token removed from the configuration
ends its sessions at the next start.

The signing key is derived from every configured token's secret: daemons sharing the same
tokens accept each other's sessions (behind a load balancer), sessions outlive a restart, and
changing the tokens signs everyone out. A holder of one token cannot forge a session for
another, since the key needs all of them. Without tokens (loopback only, the API is open too)
the key is random per process and every session is anonymous with every scope.

A CSRF token is an HMAC of the session id: every state-changing form carries it, and a POST
whose token does not match its session's is refused. The login form, which has no session
yet, is bound the same way to a short-lived random cookie of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dispatcher.config.tokens import SCOPES, ApiToken

ANONYMOUS_ID = "anonymous"
_SESSION = re.compile(r"([0-9]{1,12})\.([0-9a-f]{32})\.([0-9a-f]{32}|anonymous)\.([0-9a-f]{64})\Z")
_NONCE = re.compile(r"[0-9a-f]{32}\Z")


@dataclass(frozen=True, slots=True)
class Session:
    """A verified session: who signed in (a configured token's name) and with which scopes."""

    session_id: str
    token_id: str
    name: str
    scopes: frozenset[str]
    expires_at: int

    @property
    def can_operate(self) -> bool:
        return "operate" in self.scopes

    @property
    def on_server(self) -> bool:
        """Whether the session has a row on the server. Anonymous sessions (no tokens, loopback
        only) have none: anyone there gets a new one for the asking, so revoking means nothing,
        and a row per cookieless request would let a loop of requests fill the table."""
        return self.token_id != ANONYMOUS_ID

    @property
    def id_hash(self) -> bytes:
        """What the server stores of the session id (the id itself is a bearer secret)."""
        return hashlib.sha256(self.session_id.encode("ascii")).digest()


class SessionSigner:
    def __init__(
        self,
        tokens: Sequence[ApiToken],
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.time,
        key: bytes | None = None,
    ):
        self.ttl_s = ttl_s
        self._clock = clock
        self.open = not tokens  # no tokens: anonymous sessions with every scope
        if key is None:
            key = derive_key(tokens) if tokens else secrets.token_bytes(32)
        self._key = key
        self._tokens = {self._token_id(t): t for t in tokens}

    # sessions ---------------------------------------------------------------------------------
    def issue(self, token: ApiToken | None) -> str:
        """The cookie value of a new session for `token` (None: anonymous, open console only)."""
        if token is None and not self.open:
            raise ValueError("anonymous sessions exist only without API tokens")
        token_id = ANONYMOUS_ID if token is None else self._token_id(token)
        expires = int(self._clock() + self.ttl_s)
        body = f"{expires}.{secrets.token_hex(16)}.{token_id}"
        return f"{body}.{self._sign('session', body)}"

    def verify(self, value: str | None) -> Session | None:
        """The session `value` stands for, or None: malformed, tampered, expired, or for a token
        (or an anonymous console) that is no longer configured."""
        match = _SESSION.match(value or "")
        if match is None:
            return None
        expires, session_id, token_id, signature = match.groups()
        body = f"{expires}.{session_id}.{token_id}"
        if not hmac.compare_digest(signature, self._sign("session", body)):
            return None
        if int(expires) <= self._clock():
            return None
        if token_id == ANONYMOUS_ID:
            if not self.open:
                return None
            return Session(session_id, token_id, ANONYMOUS_ID, frozenset(SCOPES), int(expires))
        token = self._tokens.get(token_id)
        if token is None:
            return None
        return Session(session_id, token_id, token.name, token.scopes, int(expires))

    def token_ids(self) -> list[str]:
        """The ids of the configured tokens, as sessions name them."""
        return list(self._tokens)

    # CSRF ---------------------------------------------------------------------------------
    def csrf_token(self, session: Session) -> str:
        return self._sign("csrf", session.session_id)

    def check_csrf(self, session: Session, presented: str | None) -> bool:
        return hmac.compare_digest(self.csrf_token(session), ascii_only(presented))

    @staticmethod
    def new_login_nonce() -> str:
        return secrets.token_hex(16)

    def login_csrf(self, nonce: str) -> str:
        return self._sign("login", nonce)

    def check_login_csrf(self, nonce: str | None, presented: str | None) -> bool:
        if nonce is None or not _NONCE.match(nonce):
            return False
        return hmac.compare_digest(self.login_csrf(nonce), ascii_only(presented))

    # internals ----------------------------------------------------------------------------
    def _sign(self, purpose: str, text: str) -> str:
        return hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).hexdigest()

    def _token_id(self, token: ApiToken) -> str:
        return hmac.new(self._key, b"token:" + token.digest, hashlib.sha256).hexdigest()[:32]


def derive_key(tokens: Sequence[ApiToken]) -> bytes:
    """The signing key of a token set: an HMAC over every secret, in a fixed order."""
    joined = b"\x00".join(sorted(t.secret.encode("utf-8", "surrogatepass") for t in tokens))
    return hmac.new(b"dispatcher console session v1", joined, hashlib.sha256).digest()


def ascii_only(value: str | None) -> str:
    """`value` with anything outside ASCII replaced, so a comparison never raises."""
    return (value or "").encode("ascii", "replace").decode("ascii")
