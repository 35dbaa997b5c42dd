"""Guessing tokens is slowed (issue 20, defect 5): before, 300 wrong console sign-ins in 0.5 s
and 200 wrong bearer tokens all met plain 401s. Now an address meets 429 with Retry-After after
auth_failure_limit failures, logged once per burst, while other addresses are untouched. A real
daemon on loopback; the second client address is 127.0.0.2 (all of 127/8 is loopback)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.console.common import OPERATOR_TOKEN, TOKENS, form_token
from tests.harness import free_port, make_settings, running_daemon, wait_until

WRONG = "wrong-token-" + "0" * 40
LIMIT = 10  # the default auth_failure_limit


@asynccontextmanager
async def client_from(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client whose connections come from `address` (a loopback address of this host)."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as client:
        yield client


async def get_jobs(
    client: aiohttp.ClientSession, base: str, token: str, **headers: str
) -> tuple[int, Any]:
    headers["Authorization"] = f"Bearer {token}"
    async with client.get(base + "/v1/jobs?limit=1", headers=headers) as r:
        return r.status, r.headers


class SignIn:
    """The console's sign-in form, sent again and again as a browser would: each answer
    (the form again, with its error) carries the form's next CSRF token."""

    def __init__(self, client: aiohttp.ClientSession, base: str):
        self.client, self.url = client, base + "/console/login"
        self.csrf = ""

    async def attempt(self, token: str) -> tuple[int, Any]:
        if not self.csrf:
            async with self.client.get(self.url) as r:
                self.csrf = form_token(await r.text())
        data = {"csrf": self.csrf, "token": token, "next": "/console/"}
        async with self.client.post(self.url, data=data, allow_redirects=False) as r:
            self.csrf = form_token(await r.text()) if r.status != 303 else ""
            return r.status, r.headers


def assert_throttled(statuses: list[tuple[int, Any]], limit: int, window_s: float) -> None:
    assert [s for s, _ in statuses[:limit]] == [401] * limit
    assert {s for s, _ in statuses[limit:]} == {429}
    for _, headers in statuses[limit:]:
        assert 1 <= int(headers["Retry-After"]) <= window_s


async def auth_counts(client: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    """dispatcher_auth_failures_total (bearer tokens) and dispatcher_auth_refused_total."""
    async with client.get(base + "/metrics") as r:
        text = await r.text()
    found = {"failures": 0.0, "refused": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "dispatcher_auth_failures_total":
                found["failures"] += sample.value if sample.labels["what"] == "bearer token" else 0
            elif sample.name == "dispatcher_auth_refused_total":
                found["refused"] += sample.value
    return found["failures"], found["refused"]


def burst_lines(caplog: pytest.LogCaptureFixture, address: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "dispatcher.api.guessing" and address in r.getMessage()
    ]


async def test_wrong_bearer_tokens_meet_429_and_other_addresses_do_not(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(db_url, api_tokens=TOKENS)
    async with (
        running_daemon(settings) as daemon,
        client_from("127.0.0.1") as guesser,
        client_from("127.0.0.2") as other,
    ):
        base = daemon.base_url
        failures, refused = await auth_counts(other, base)
        statuses = [await get_jobs(guesser, base, f"{WRONG}{n}") for n in range(200)]
        assert_throttled(statuses, LIMIT, settings.auth_failure_window_s)
        async with guesser.get(base + "/v1/jobs", headers={"Authorization": "Bearer x"}) as r:
            assert r.content_type == "application/problem+json"
            assert "too many failed authentications" in (await r.json())["detail"]
        # a right token from the guessing address waits too (else guessing would go on) ...
        assert (await get_jobs(guesser, base, OPERATOR_TOKEN))[0] == 429
        # ... and from another address works, whose wrong tokens are counted apart
        assert (await get_jobs(other, base, OPERATOR_TOKEN))[0] == 200
        assert (await get_jobs(other, base, WRONG))[0] == 401
        assert (await get_jobs(guesser, base, OPERATOR_TOKEN))[0] == 429  # not reset by it
        async with guesser.get(base + "/healthz") as r:
            assert r.status == 200  # unauthenticated paths are not limited
        # counted: 10 + 1 wrong tokens; refused: 190 + 1 wrong, 2 right from the guesser
        assert await auth_counts(other, base) == (failures + 11, refused + 193)
    # once per burst: its first failure and the moment the address is refused, not 200 lines
    assert len(burst_lines(caplog, "127.0.0.1")) == 2
    assert WRONG not in caplog.text


async def test_wrong_console_sign_ins_meet_429_and_other_addresses_sign_in(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(db_url, api_tokens=TOKENS)
    async with (
        running_daemon(settings) as daemon,
        client_from("127.0.0.1") as guesser,
        client_from("127.0.0.2") as other,
    ):
        base = daemon.base_url
        guessing = SignIn(guesser, base)
        statuses = [await guessing.attempt(f"{WRONG}{n}") for n in range(300)]
        assert_throttled(statuses, LIMIT, settings.auth_failure_window_s)
        assert (await guessing.attempt(OPERATOR_TOKEN))[0] == 429
        status, headers = await SignIn(other, base).attempt(OPERATOR_TOKEN)
        assert (status, headers["Location"]) == (303, "/console/")
        async with other.get(base + "/console/") as r:
            assert r.status == 200
        assert (await guessing.attempt(OPERATOR_TOKEN))[0] == 429
    assert len(burst_lines(caplog, "127.0.0.1")) == 2


@pytest.mark.parametrize("console_listener", ["mounted", "own"])
async def test_the_api_and_the_console_count_together_and_the_window_ends(
    db_url: str, console_listener: str
) -> None:
    own = {"console_listen": f"127.0.0.1:{free_port()}"} if console_listener == "own" else {}
    settings = make_settings(
        db_url, api_tokens=TOKENS, auth_failure_limit=4, auth_failure_window_s=1.5, **own
    )
    async with running_daemon(settings) as daemon, client_from("127.0.0.1") as client:
        base = daemon.base_url
        signing_in = SignIn(client, f"http://{settings.console_listen}" if own else base)
        assert [(await get_jobs(client, base, WRONG))[0] for _ in range(2)] == [401, 401]
        assert [(await signing_in.attempt(WRONG))[0] for _ in range(2)] == [401, 401]
        status, headers = await get_jobs(client, base, OPERATOR_TOKEN)
        assert status == 429 and int(headers["Retry-After"]) <= 2

        async def admitted() -> bool:
            return (await get_jobs(client, base, OPERATOR_TOKEN))[0] == 200

        await wait_until(admitted, timeout_s=10, interval_s=0.2, what="the window to end")
        assert (await get_jobs(client, base, WRONG))[0] == 401  # a new window


async def test_x_forwarded_for_counts_only_from_a_trusted_proxy(db_url: str) -> None:
    async with (
        running_daemon(make_settings(db_url, api_tokens=TOKENS, auth_failure_limit=3)) as daemon,
        client_from("127.0.0.1") as client,
    ):
        base = daemon.base_url
        for n in range(3):  # a different forged client each time: still one peer
            await get_jobs(client, base, WRONG, **{"X-Forwarded-For": f"198.51.100.{n}"})
        forged = {"X-Forwarded-For": "192.0.2.1"}
        assert (await get_jobs(client, base, OPERATOR_TOKEN, **forged))[0] == 429
    trusted = make_settings(
        db_url, api_tokens=TOKENS, auth_failure_limit=3, trusted_proxies=["127.0.0.1/32"]
    )
    async with running_daemon(trusted) as daemon, client_from("127.0.0.1") as proxy:
        base = daemon.base_url
        behind = {"X-Forwarded-For": "203.0.113.7, 127.0.0.1"}  # right-most untrusted hop
        assert [(await get_jobs(proxy, base, WRONG, **behind))[0] for _ in range(4)] == [
            401, 401, 401, 429,
        ]  # fmt: skip
        another = {"X-Forwarded-For": "203.0.113.8"}
        assert (await get_jobs(proxy, base, OPERATOR_TOKEN, **another))[0] == 200
        assert (await get_jobs(proxy, base, OPERATOR_TOKEN))[0] == 200  # the proxy itself
