"""Shared by the console tests: tokens, sign-in over plain HTTP, hostile jobs."""

from __future__ import annotations

import re
from typing import Any

import aiohttp

OPERATOR_TOKEN = "console-op-token-3f9c1e7a5b2d8046c1e7"
VIEWER_TOKEN = "console-ro-token-a84d0b6f2e91c3577d02"
TOKENS = [f"{OPERATOR_TOKEN} read,enqueue,operate # ops", f"{VIEWER_TOKEN} read # viewer"]
TOKENS_ENV = ";".join(TOKENS)
# What an attacker could put into a job: markup in the key, the tenant, the payload and the
# error the target answers with; quotes; an escape sequence and a right-to-left override.
HOSTILE_KEY = "\"'><script>window.__pwned='key'</script>"
HOSTILE_TENANT = "<img src=x onerror=\"window.__pwned='tenant'\">\x1b[31m\u202eevil"
HOSTILE_PAYLOAD = {
    "note": "</pre><script>window.__pwned='payload'</script>",
    "quote": "\"'`",
    "control": "bell\x07 escape\x1b[2J",
}
HOSTILE_ERROR = "<script>window.__pwned='error'</script>"


def session() -> aiohttp.ClientSession:
    # the console's cookies come from 127.0.0.1: aiohttp keeps cookies of IP hosts only if told
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


def form_token(html: str, name: str = "csrf") -> str:
    match = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert match is not None, html[:2000]
    return match.group(1)


async def sign_in(client: aiohttp.ClientSession, base: str, token: str) -> aiohttp.ClientResponse:
    async with client.get(f"{base}/console/login") as r:
        csrf = form_token(await r.text())
    response = await client.post(
        f"{base}/console/login",
        data={"csrf": csrf, "token": token, "next": "/console/"},
        allow_redirects=False,
    )
    response.release()
    return response


async def page(client: aiohttp.ClientSession, url: str) -> tuple[int, str, Any]:
    async with client.get(url, allow_redirects=False) as r:
        return r.status, await r.text(), r.headers
