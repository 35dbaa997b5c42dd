"""Console sessions and CSRF tokens (dispatcher.console.session), the target mask and the
escaping of invisible characters, and the chart's ring of samples: pure logic, injected clocks."""

from __future__ import annotations

import pytest

from dispatcher.config.tokens import parse_entry
from dispatcher.console.session import SessionSigner
from dispatcher.console.toolkit import printable
from dispatcher.console.web import safe_next
from dispatcher.core.redact import MASK, masked_target, masked_url

OPERATOR = parse_entry("op-secret operate,read # ops", "test", "ops")
VIEWER = parse_entry("ro-secret read # viewer", "test", "viewer")
TOKENS = [t for t in (OPERATOR, VIEWER) if t is not None]


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_session_names_its_token_and_its_scopes() -> None:
    signer = SessionSigner(TOKENS, 3600, clock=Clock())
    session = signer.verify(signer.issue(VIEWER))
    assert session is not None
    assert (session.name, session.scopes, session.can_operate) == ("viewer", {"read"}, False)
    operator = signer.verify(signer.issue(OPERATOR))
    assert operator is not None and operator.can_operate
    cookie = signer.issue(OPERATOR)
    assert "op-secret" not in cookie and OPERATOR.digest.hex()[:16] not in cookie


@pytest.mark.parametrize("position", [0, 12, 40, 80, -1])
def test_a_tampered_cookie_is_refused(position: int) -> None:
    signer = SessionSigner(TOKENS, 3600, clock=Clock())
    cookie = signer.issue(VIEWER)
    flipped = "1" if cookie[position] != "1" else "2"
    tampered = (
        cookie[:position] + flipped + cookie[position + 1 :]
        if position != -1
        else cookie[:-1] + flipped
    )
    assert signer.verify(tampered) is None


def test_a_read_session_cannot_be_turned_into_an_operator_one() -> None:
    signer = SessionSigner(TOKENS, 3600, clock=Clock())
    viewer, operator = signer.issue(VIEWER).split("."), signer.issue(OPERATOR).split(".")
    viewer[2] = operator[2]  # the operator's token id with the viewer's signature
    assert signer.verify(".".join(viewer)) is None


def test_a_session_expires() -> None:
    clock = Clock()
    signer = SessionSigner(TOKENS, 600, clock=clock)
    cookie = signer.issue(OPERATOR)
    clock.now += 599
    assert signer.verify(cookie) is not None
    clock.now += 1
    assert signer.verify(cookie) is None


def test_sessions_hold_across_restarts_and_end_when_the_tokens_change() -> None:
    cookie = SessionSigner(TOKENS, 3600, clock=Clock()).issue(VIEWER)
    assert SessionSigner(TOKENS, 3600, clock=Clock()).verify(cookie) is not None  # a restart
    assert SessionSigner([VIEWER], 3600, clock=Clock()).verify(cookie) is None  # operator gone
    assert SessionSigner([], 3600, clock=Clock()).verify(cookie) is None


@pytest.mark.parametrize("garbage", ["", "x", "1.2.3.4", "9" * 5000, "é.é.é.é", None])
def test_garbage_is_no_session(garbage: str | None) -> None:
    assert SessionSigner(TOKENS, 3600).verify(garbage) is None


def test_anonymous_sessions_exist_only_without_tokens() -> None:
    open_signer = SessionSigner([], 3600)
    session = open_signer.verify(open_signer.issue(None))
    assert session is not None and session.can_operate
    with pytest.raises(ValueError):
        SessionSigner(TOKENS, 3600).issue(None)


def test_the_csrf_token_belongs_to_its_session() -> None:
    signer = SessionSigner(TOKENS, 3600, clock=Clock())
    one = signer.verify(signer.issue(OPERATOR))
    two = signer.verify(signer.issue(OPERATOR))
    assert one is not None and two is not None
    assert signer.check_csrf(one, signer.csrf_token(one))
    assert not signer.check_csrf(one, signer.csrf_token(two))
    for bad in (None, "", "x" * 64, "é" * 64):
        assert not signer.check_csrf(one, bad)
    nonce = signer.new_login_nonce()
    assert signer.check_login_csrf(nonce, signer.login_csrf(nonce))
    assert not signer.check_login_csrf(signer.new_login_nonce(), signer.login_csrf(nonce))
    assert not signer.check_login_csrf(None, signer.login_csrf(nonce))


def test_after_sign_in_only_console_paths_are_followed() -> None:
    assert safe_next("/console/jobs?state=dead") == "/console/jobs?state=dead"
    for elsewhere in (
        "https://evil.example/",
        "//evil.example/",
        "/console/\\evil",
        "/v1/jobs",
        None,
    ):
        assert safe_next(elsewhere) == "/console/"


def test_targets_are_shown_without_secrets() -> None:
    shown = masked_target(
        {
            "url": "https://user:pw@hooks.example:8443/p/a?sig=abc&x=1",
            "method": "PUT",
            "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k"},
            "timeout_s": 30,
        }
    )
    assert shown is not None
    text = repr(shown)
    assert "s3cret" not in text and "pw" not in text and "abc" not in text and "'k'" not in text
    assert shown["headers"] == {"Authorization": MASK, "X-Api-Key": MASK}
    assert shown["url"] == f"https://user:{MASK}@hooks.example:8443/p/a?sig={MASK}&x={MASK}"
    assert (shown["method"], shown["timeout_s"]) == ("PUT", 30)
    assert masked_target(None) is None
    assert masked_url("http://[::1]:80/x") == "http://[::1]:80/x"


def test_invisible_characters_are_written_out() -> None:
    assert printable("a\x00b\x1b[31m\u202eevil\u200b") == "a\\u0000b\\u001b[31m\\u202eevil\\u200b"
    assert printable("line one\nline two\ttab é 中") == "line one\nline two\ttab é 中"
