"""Signing-secret rotation on a real daemon process: `dispatcher signing-secret rotate`, then
SIGHUP, and the next push carries a signature from the new primary and one from the old, each
verified alone by the Standard Webhooks reference library; a secret whose overlap had ended
before the start is never used; a file broken before a SIGHUP is logged naming its line, and
the secrets in use keep signing. No secret appears in the daemon's log."""

from __future__ import annotations

import base64
import signal
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatcher.client.webhooks import WebhookVerifier
from dispatcher.config.signing_secret import parse_secrets
from tests.harness import (
    LOOPBACK_ENV,
    Target,
    cli,
    daemon_process,
    post,
    serve_target,
    terminate,
    wait_until,
)

OLD = "whsec_" + base64.b64encode(b"the old primary key of this test").decode()
ENDED = "whsec_" + base64.b64encode(b"a key whose overlap ended before").decode()


def verifies(secret: str, request: dict[str, Any]) -> bool:
    try:
        Webhook(secret).verify(request["body"], request["headers"])
    except WebhookVerificationError:
        return False
    return True


async def pushed(daemon: Any, target: Target, key: str) -> dict[str, Any]:
    status, _ = await post(daemon, key, {"handler": "http", "target": {"url": target.url}})
    assert status == 202
    await wait_until(lambda: key in target.request_keys(), what=f"the push of {key}")
    return next(r for r in target.requests if r["key"] == key)


def signatures(request: dict[str, Any]) -> int:
    return len(request["headers"]["webhook-signature"].split(" "))


async def test_rotate_then_sighup_signs_with_both_and_a_bad_file_changes_nothing(
    db_url: str, tmp_path: Path
) -> None:
    secrets = tmp_path / "signing-secrets"
    secrets.write_text(f"{OLD}\n{ENDED} not-after=2026-01-01T00:00:00Z\n")
    env = {
        **LOOPBACK_ENV,
        "DISPATCHER_DATABASE_URL": db_url,
        "DISPATCHER_HTTP__SIGNING_SECRET_FILE": str(secrets),
    }
    async with serve_target(Target()) as target, daemon_process(env) as daemon:
        first = await pushed(daemon, target, "before-rotation")
        assert (verifies(OLD, first), verifies(ENDED, first), signatures(first)) == (True, False, 1)

        rotation = await cli(
            "signing-secret", "rotate", "--overlap-s", "3600", cwd=tmp_path, env=env
        )
        assert rotation.code == 0, rotation.stderr
        assert "dropped: 1 secret(s) whose overlap ended" in rotation.stdout
        in_file = parse_secrets(secrets.read_text(), "file")
        new = in_file[0].secret
        assert [s.secret for s in in_file] == [new, OLD] and new != OLD
        assert new not in rotation.stdout + rotation.stderr  # fingerprints only

        unreloaded = await pushed(daemon, target, "rotated-not-reloaded")
        assert (verifies(OLD, unreloaded), verifies(new, unreloaded)) == (True, False)

        daemon.signal(signal.SIGHUP)
        await wait_until(lambda: "signing secrets reloaded" in daemon.log_text(), what="the reload")
        both = await pushed(daemon, target, "after-sighup")
        assert (verifies(new, both), verifies(OLD, both), signatures(both)) == (True, True, 2)
        for secret in (new, OLD):  # our own receiver helper too, knowing either one
            WebhookVerifier([secret]).verify(both["headers"], both["body"])

        good_text = secrets.read_text()
        secrets.write_text(good_text + "whsec_not*base64!\n")
        daemon.signal(signal.SIGHUP)
        await wait_until(
            lambda: "the signing secrets in use stay" in daemon.log_text(),
            what="the refused reload",
        )
        kept = await pushed(daemon, target, "after-a-bad-file")
        assert (verifies(new, kept), verifies(OLD, kept), signatures(kept)) == (True, True, 2)
        await terminate(daemon)
    log = daemon.log_text()
    assert "line 5: a signing secret is 'whsec_' followed by base64" in log
    for secret in (OLD, ENDED, new):
        assert secret.removeprefix("whsec_")[:16] not in log
    assert "not*base64" not in log
