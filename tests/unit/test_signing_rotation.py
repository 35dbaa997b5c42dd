"""Several signing secrets and their rotation: the file format (errors name the line and never
a secret), the rotation's arithmetic, and signatures from every secret in use, each verified by
the Standard Webhooks reference library; an ended secret stops signing on time, unreloaded."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatcher.config import secret_rotation
from dispatcher.config.settings import Settings
from dispatcher.config.signing_secret import (
    SigningSecret,
    format_secrets,
    parse_secrets,
    rotated,
)
from dispatcher.effects.signing import SignerSet


def secret(n: int) -> str:
    return "whsec_" + base64.b64encode(bytes([n]) * 32).decode()


A, B, C = secret(1), secret(2), secret(3)
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_the_file_holds_a_primary_then_older_secrets_with_their_ends() -> None:
    text = f"""
# rotated on 2026-12-01
{A}
{B} not-after=2026-12-03T00:00:00Z   # the one before
{C} not-after=2026-12-02T13:00:00+01:00
"""
    found = parse_secrets(text, "f")
    assert [(s.secret, s.not_after, s.line) for s in found] == [
        (A, None, 3),
        (B, datetime(2026, 12, 3, tzinfo=UTC), 4),
        (C, datetime(2026, 12, 2, 12, tzinfo=UTC), 5),
    ]
    assert format_secrets(found).count("not-after=") == 2
    assert parse_secrets(format_secrets(found), "again")[1:] == [
        SigningSecret(B, datetime(2026, 12, 3, tzinfo=UTC), 4),
        SigningSecret(C, datetime(2026, 12, 2, 12, tzinfo=UTC), 5),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "f: no secret"),
        ("# only a comment\n", "f: no secret"),
        (f"{A}\nwhsec_not*base64\n", "f line 2: a signing secret is 'whsec_' followed by base64"),
        (f"{A} not-after=2027-01-01T00:00:00Z\n", "f line 1: the primary secret"),
        (f"{A}\n{B} {C}\n", "f line 2: unexpected text after the secret"),
        (f"{A}\n{B} until=2027-01-01\n", "f line 2: unexpected text after the secret"),
        (f"{A}\n{B} not-after=2027-01-01\n", "f line 2: not-after must be an RFC 3339"),
        (f"{A}\n\n{A}\n", "f line 3: the same secret as line 1"),
    ],
)
def test_a_bad_file_is_refused_naming_the_line_never_a_secret(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_secrets(text, "f")
    assert str(caught.value).startswith(message), caught.value
    for s in (A, B, C):
        assert s.removeprefix("whsec_")[:12] not in str(caught.value)


def test_rotation_puts_a_new_primary_first_and_keeps_the_old_for_the_overlap() -> None:
    current = [
        SigningSecret(A),
        SigningSecret(B, NOW + timedelta(hours=1)),
        SigningSecret(C, NOW - timedelta(seconds=1)),  # its overlap has ended: dropped
    ]
    new = secret(9)
    after = rotated(current, new, NOW, overlap_s=86_400)
    assert after == [
        SigningSecret(new),
        SigningSecret(A, NOW + timedelta(days=1)),
        SigningSecret(B, NOW + timedelta(hours=1)),
    ]
    # no overlap: the old primary stops at once
    assert rotated([SigningSecret(A)], new, NOW, overlap_s=0) == [SigningSecret(new)]


def headers(signers: SignerSet, now: float, body: bytes) -> dict[str, str]:
    signature = signers.signature_bytes(b"job-1", int(now), body, now).decode()
    return {
        "webhook-id": "job-1",
        "webhook-timestamp": str(int(now)),
        "webhook-signature": signature,
    }


def test_every_secret_in_use_signs_and_each_verifies_alone() -> None:
    now = datetime.now(UTC)
    signers = SignerSet([SigningSecret(A), SigningSecret(B, now + timedelta(hours=1))])
    body = b'{"n":1}'
    sent = headers(signers, now.timestamp(), body)
    assert len(sent["webhook-signature"].split(" ")) == 2
    assert sent["webhook-signature"].startswith("v1,")
    for key in (A, B):  # a receiver that knows only one of them accepts the push
        assert Webhook(key).verify(body, sent) == {"n": 1}
    with pytest.raises(WebhookVerificationError):
        Webhook(C).verify(body, sent)


def test_an_ended_secret_stops_signing_at_its_end_without_a_reload() -> None:
    now = datetime.now(UTC).timestamp()
    signers = SignerSet([SigningSecret(A), SigningSecret(B, datetime.fromtimestamp(now + 30, UTC))])
    body = b"{}"
    at_end = headers(signers, now + 30, body)  # at its end: still in use
    assert len(at_end["webhook-signature"].split()) == 2
    # after it: the primary alone (the clock passed in decides; stamped now for the library)
    later = signers.signature_bytes(b"job-1", int(now), body, now + 31).decode()
    sent = {"webhook-id": "job-1", "webhook-timestamp": str(int(now)), "webhook-signature": later}
    assert len(later.split()) == 1
    assert Webhook(A).verify(body, sent) == {}
    with pytest.raises(WebhookVerificationError):
        Webhook(B).verify(body, sent)


def test_settings_read_every_secret_from_the_file_or_inline(tmp_path: Path) -> None:
    file = tmp_path / "secrets"
    file.write_text(f"{A}\n{B} not-after=2030-01-01T00:00:00Z\n")
    from_file = Settings.model_validate({"http": {"signing_secret_file": str(file)}})
    assert [s.secret for s in from_file.signing_secrets()] == [A, B]
    assert from_file.signing_secret() == A
    shown = from_file.public_view()["signing_secrets"]  # check-config: fingerprints only
    assert shown == [
        SigningSecret(A).fingerprint,
        f"{SigningSecret(B).fingerprint} until 2030-01-01T00:00:00Z",
    ]
    assert A not in str(from_file.public_view()) and B not in str(from_file.public_view())
    inline = Settings.model_validate(
        {"http": {"signing_secret": f"{A}; {B} not-after=2030-01-01T00:00:00Z"}}
    )
    assert [s.secret for s in inline.signing_secrets()] == [A, B]
    assert Settings.model_validate({}).signing_secrets() == []


def test_settings_refuse_a_bad_file_or_both_sources(tmp_path: Path) -> None:
    file = tmp_path / "secrets"
    file.write_text(f"{A}\n{B} not-after=soon\n")
    with pytest.raises(ValueError, match=r"signing_secret_file .* line 2: not-after"):
        Settings.model_validate({"http": {"signing_secret_file": str(file)}})
    file.write_text(f"{A}\n")
    with pytest.raises(ValueError, match="not both"):
        Settings.model_validate({"http": {"signing_secret_file": str(file), "signing_secret": B}})
    with pytest.raises(ValueError, match=r"http\.signing_secret entry 2: the same secret"):
        Settings.model_validate({"http": {"signing_secret": f"{A};{A}"}})


def rotate(settings: Settings, *extra: str) -> int:
    from dispatcher.cli import build_parser

    args = build_parser().parse_args(["signing-secret", "rotate", *extra])
    return secret_rotation.cmd_signing_secret(settings, args)


def test_rotate_keeps_the_files_mode_and_refuses_a_bad_file_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "secrets"
    file.write_text(f"{A}\n")
    file.chmod(0o640)
    settings = Settings.model_validate({"http": {"signing_secret_file": str(file)}})
    assert rotate(settings, "--overlap-s", "60") == 0
    after = parse_secrets(file.read_text(), "f")
    assert [s.secret for s in after][1:] == [A] and after[1].not_after is not None
    assert file.stat().st_mode & 0o777 == 0o640
    printed = capsys.readouterr().out
    assert after[1].fingerprint in printed
    assert A not in printed and after[0].secret not in printed  # fingerprints only
    broken = file.read_text() + "whsec_not*base64!\n"
    file.write_text(broken)
    with pytest.raises(SystemExit, match=r"line 5: .*; the file was not changed"):
        rotate(settings, "--file", str(file))
    assert file.read_text() == broken
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_rotate_creates_a_missing_file_private_and_says_what_an_inline_secret_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = tmp_path / "new-secrets"
    assert rotate(Settings.model_validate({}), "--file", str(new)) == 0
    assert new.stat().st_mode & 0o777 == 0o600
    assert len(parse_secrets(new.read_text(), "f")) == 1
    inline = Settings.model_validate({"http": {"signing_secret": A}})
    assert rotate(inline) == 1
    assert "move it to a file named by http.signing_secret_file" in capsys.readouterr().err
    assert rotate(inline, "--file", str(new), "--overlap-s", "-1") == 1
