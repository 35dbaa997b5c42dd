"""Standard Webhooks signing, verified by the reference implementation."""

from __future__ import annotations

import base64
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatcher.config.signing_secret import decode_secret
from dispatcher.effects.signing import Signer, sign, webhook_headers

SECRET = "whsec_" + base64.b64encode(b"a 32 byte key for the test suite").decode()


def test_reference_library_verifies_our_headers() -> None:
    body = b'{"order":42,"note":"caf\\u00e9"}'
    headers = webhook_headers(SECRET, "job-key-1", int(time.time()), body)
    assert Webhook(SECRET).verify(body, headers) == {"order": 42, "note": "café"}


def test_reference_library_rejects_a_tampered_body() -> None:
    headers = webhook_headers(SECRET, "job-key-1", int(time.time()), b'{"amount":1}')
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(b'{"amount":1000}', headers)


def test_spec_example_vector() -> None:
    # The worked example published with the Standard Webhooks specification.
    signature = sign(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_one_signer_signs_many_messages_alike() -> None:
    # the keyed HMAC is copied per signature: an earlier message never leaks into a later one
    signer = Signer(SECRET)
    for n in range(3):
        body = b'{"n":%d}' % n
        assert signer.signature(f"key-{n}", 1700000000 + n, body) == sign(
            SECRET, f"key-{n}", 1700000000 + n, body
        )
        headers = webhook_headers(SECRET, f"key-{n}", int(time.time()), body)
        assert Webhook(SECRET).verify(body, headers) == {"n": n}


def test_unpadded_secret_is_accepted() -> None:
    padded = "whsec_" + base64.b64encode(b"sixteen byte key").decode()
    assert padded.endswith("=")
    assert decode_secret(padded.rstrip("=")) == decode_secret(padded) == b"sixteen byte key"


def test_without_secret_only_id_and_timestamp() -> None:
    assert webhook_headers(None, "k", 1700000000, b"{}") == {
        "webhook-id": "k",
        "webhook-timestamp": "1700000000",
    }


@pytest.mark.parametrize("secret", ["whsec_", "whsec_not base64!"])
def test_bad_secret_is_a_clear_error(secret: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        decode_secret(secret)
