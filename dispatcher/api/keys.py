"""The API application's keys: what `create_app` puts in the application for its handlers
(and for the console, which reads through the same application)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dispatcher.api.guessing import GuessLimiter
from dispatcher.config.settings import Settings
from dispatcher.db.jobs import JobRepository
from dispatcher.intake.accept import Intake
from dispatcher.operator.service import Operator

Readiness = Callable[[], Awaitable[tuple[bool, str]]]

REPO = web.AppKey("repo", JobRepository)
INTAKE = web.AppKey("intake", Intake)
OPERATOR = web.AppKey("operator", Operator)
READINESS = web.AppKey("readiness", object)
TOKENS = web.AppKey("tokens", list)
BODY_LIMIT = web.AppKey("body_limit_bytes", int)
BODY_TIMEOUT = web.AppKey("body_read_timeout_s", float)
SETTINGS = web.AppKey("settings", Settings)
# The served OpenAPI document (built from the route table, dispatcher.api.routes).
DESCRIPTION: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("description")
# Set on a sub-application that authenticates its own requests (the console: session cookies);
# the bearer-token check leaves its routes to it.
OWN_AUTH = web.AppKey("own_auth", bool)
# Failed authentications per client address (the console's sign-in counts here too).
GUESSES = web.AppKey("guesses", GuessLimiter)
# Who a request is from (the token's name, or ANONYMOUS), as the auth middleware found it
# (typed keys for requests exist from aiohttp 3.12 on).
CALLER: Any = (
    web.RequestKey("dispatcher_caller", str) if hasattr(web, "RequestKey") else "dispatcher_caller"
)
# Who operator actions are logged as when the API has no tokens (loopback only).
ANONYMOUS = "anonymous (no API tokens configured)"
