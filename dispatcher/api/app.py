"""The aiohttp application: the router read from the route table (dispatcher.api.routes),
authentication and scopes, problem responses, and the separate health and metrics listener."""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from dispatcher.api import health
from dispatcher.api.guessing import GuessLimiter, client_address
from dispatcher.api.keys import (
    ANONYMOUS,
    BODY_LIMIT,
    BODY_TIMEOUT,
    CALLER,
    DESCRIPTION,
    GUESSES,
    INTAKE,
    OPERATOR,
    OWN_AUTH,
    READINESS,
    REPO,
    SETTINGS,
    TOKENS,
    Readiness,
)
from dispatcher.api.openapi import openapi_document
from dispatcher.api.operate import RETRY_AFTER_S, operator_problem
from dispatcher.api.problems import Problem, problem
from dispatcher.api.routes import PUBLIC_PATHS, ROUTES
from dispatcher.api.scopes import required_scope
from dispatcher.config.settings import Settings
from dispatcher.config.tokens import SCOPES, ApiToken, digest
from dispatcher.db.jobs import JobRepository
from dispatcher.engine.sampler import MetricsSampler
from dispatcher.errors import DatabaseUnavailable
from dispatcher.intake.accept import Intake
from dispatcher.operator.errors import OperatorError
from dispatcher.operator.service import Operator

log = logging.getLogger(__name__)

__all__ = ["PUBLIC_PATHS", "create_app", "create_metrics_app"]


def create_app(
    *,
    repo: JobRepository,
    intake: Intake,
    readiness: Readiness,
    tokens: Sequence[str | ApiToken],
    body_limit_bytes: int,
    schedules: Any = None,
    body_read_timeout_s: float = 30.0,
    settings: Settings | None = None,
    sampler: MetricsSampler | None = None,
    operator: Operator | None = None,
) -> web.Application:
    """The API application, its routes read from `ROUTES`. `operator`: the daemon's operator
    service; without one, one is made of `repo`, `settings`, `sampler` and `schedules`."""
    app = web.Application(
        client_max_size=body_limit_bytes, middlewares=[problem_middleware, auth_middleware]
    )
    settings = settings or Settings()
    app[REPO] = repo
    app[INTAKE] = intake
    app[READINESS] = readiness
    app[TOKENS] = [
        t if isinstance(t, ApiToken) else ApiToken(f"token {n}", frozenset(SCOPES), "api", t)
        for n, t in enumerate(tokens, 1)
    ]
    app[BODY_LIMIT] = body_limit_bytes
    app[BODY_TIMEOUT] = body_read_timeout_s
    app[SETTINGS] = settings
    app[OPERATOR] = operator or Operator(
        repo,
        settings,
        sampler=sampler,
        schedules=schedules,
        on_ready=intake.notify_accepted if intake is not None else lambda: None,
    )
    app[GUESSES] = GuessLimiter(settings.auth_failure_limit, settings.auth_failure_window_s)
    app[DESCRIPTION] = lambda: openapi_document()
    for route in ROUTES:
        if route.method == "GET":  # and HEAD
            app.router.add_get(route.path, route.handler)
        else:
            app.router.add_route(route.method, route.path, route.handler)
    return app


class ProblemRequestHandler(web.RequestHandler):
    """aiohttp's connection protocol, except for requests its HTTP parser refuses (a byte not
    allowed in the request line or a header, such as NUL or another control character; a line
    over 8,190 bytes; too many headers): those are answered with a problem document like every
    other 4xx, and logged as one INFO line, not as an error with a traceback, since anyone who
    can connect can send them."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        # the parser's message quotes the offending bytes on the lines below its first
        reason = (message or str(exc) or "malformed").split("\n", 1)[0]
        reason = re.sub(r":\s*(b'|bytearray\().*", "", reason).rstrip(": .")[:200]
        log.info("refused an unparseable HTTP request from %s: %s", request.remote, reason)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was already started; cannot send a problem")
        response = problem(
            status,
            f"the HTTP request could not be parsed: {reason}; header values may not hold NUL "
            "or other control characters, and a request line or header may not exceed 8190 "
            "bytes",
        )
        response.force_close()
        return response


class _ProblemServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return ProblemRequestHandler(self, loop=self._loop, **self._kwargs)


class ProblemAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections are `ProblemRequestHandler`s. aiohttp offers no
    setting for the protocol class: its `Server` names `RequestHandler` itself."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _ProblemServer  # same state; only `__call__` differs
        return server


def create_metrics_app(readiness: Readiness) -> web.Application:
    """The optional separate listener: health and metrics only, nothing that changes state."""
    app = web.Application(middlewares=[problem_middleware])
    app[READINESS] = readiness
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics_endpoint)
    return app


# middlewares -------------------------------------------------------------------------------
@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as exc:
        return exc.response()
    except OperatorError as exc:
        return operator_problem(exc)
    except DatabaseUnavailable as exc:
        log.warning("%s %s answered 503: %s", request.method, request.path, exc)
        return database_unavailable()
    except web.HTTPRequestEntityTooLarge:
        return problem(
            413,
            f"body exceeds the limit of {request.app[BODY_LIMIT]} bytes; split "
            "the work into smaller requests (or raise body_limit_bytes)",
        )
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return problem(
            405,
            f"{request.method} is not allowed on {request.path}; use {allowed}",
            headers={"Allow": ",".join(sorted(exc.allowed_methods))},
        )
    except web.HTTPNotFound:
        return problem(404, f"no resource {request.path}; GET /openapi.json lists the API")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return problem(exc.status, exc.reason)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem(500, "internal error; the request may be retried with the same key")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate (with tokens configured), check the route's scope, and note the caller
    for the operator service's audit line (dispatcher.operator.audit)."""
    if request.path in PUBLIC_PATHS or owns_auth(request):
        return await handler(request)
    tokens: list[ApiToken] = request.app[TOKENS]
    routed = request.match_info.http_exception is None  # else a 404 or 405 follows
    route = request.match_info.route.resource
    scope = required_scope(request.method, route.canonical) if routed and route else None
    caller = ANONYMOUS
    if tokens:
        guesses, client = request.app[GUESSES], client_of(request.app, request)
        if (wait_s := guesses.retry_after_s(client)) is not None:
            return too_many_failures(wait_s)
        token = authenticate(tokens, request.headers.get("Authorization", ""))
        if token is None:
            if "Authorization" in request.headers:  # no header is no guess
                guesses.failed(client, "bearer token")
            return problem(
                401,
                "missing or invalid bearer token: send 'Authorization: Bearer "
                "<token>' with a token from DISPATCHER_API_TOKENS",
                headers={"WWW-Authenticate": 'Bearer realm="dispatcher"'},
            )
        if scope is not None and scope not in token.scopes:
            log.warning(
                "token %r refused %s %s: it lacks scope %s",
                token.name,
                request.method,
                request.path,
                scope,
                extra={"token": token.name},
            )
            return problem(
                403,
                f"token {token.name!r} lacks scope {scope!r}, which {request.method} "
                f"{route.canonical if route else request.path} needs; give the token that scope "
                "(TOKEN read,enqueue,operate in DISPATCHER_API_TOKENS_FILE) or use another",
                scope=scope,
            )
        caller = token.name
    request[CALLER] = caller  # the operator service's audit line names it
    return await handler(request)


def client_of(api: web.Application, request: web.Request) -> str:
    """The client's address, as failed authentications are counted by (api.guessing); `api`
    is the API application, whose settings name the trusted proxies."""
    return client_address(
        request.remote, request.headers.get("X-Forwarded-For"), api[SETTINGS].trusted_proxies
    )


def too_many_failures(retry_after_s: int) -> web.Response:
    return problem(
        429,
        f"too many failed authentications from this address; retry in {retry_after_s} s "
        "with a valid token (the limit: auth_failure_limit per auth_failure_window_s)",
        headers={"Retry-After": str(retry_after_s)},
    )


def owns_auth(request: web.Request) -> bool:
    """Whether the route belongs to a sub-application marked OWN_AUTH, or is a handler marked
    `own_auth` (the console's redirect from /console to /console/)."""
    info = request.match_info
    return any(OWN_AUTH in app for app in info.apps) or getattr(info.handler, "own_auth", False)


def authenticate(tokens: list[ApiToken], header: str) -> ApiToken | None:
    """The token the Authorization header presents, or None. Every configured token is
    compared, in constant time, against the SHA-256 of what was presented (a fixed length),
    so the time taken reveals neither which token nor how much of one matched."""
    scheme, _, presented = header.partition(" ")
    given = digest(header_bytes(presented.strip()))
    matches = [hmac.compare_digest(given, token.digest) for token in tokens]
    if scheme.lower() != "bearer" or True not in matches:
        return None
    return tokens[matches.index(True)]


def header_bytes(value: str) -> bytes:
    """A header value as bytes, never raising: aiohttp hands bytes that are not UTF-8 over as
    lone surrogates, on which `str.encode()` raises; encoded as they are, they match no token
    (tokens are valid UTF-8)."""
    return value.encode("utf-8", "surrogatepass")


def database_unavailable(detail: str = "") -> web.Response:
    return problem(
        503,
        detail
        or f"the database is unavailable; retry in {RETRY_AFTER_S} s (a retried request with "
        "the same Idempotency-Key creates nothing twice)",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )
