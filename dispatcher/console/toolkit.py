"""The console's toolkit: app keys, security headers, the session middleware, rendering.

Every page is rendered on the server by Jinja2 with autoescaping, and every string value is
also passed through `printable` (control and bidirectional-override characters shown as
`\\uXXXX`), so nothing stored in a job (payload, key, tenant, error excerpt) can become markup
or disguise itself. The pages (dispatcher.console.pages) and the application factory
(dispatcher.console.web) both build on this module; it imports neither.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import web
from aiohttp.typedefs import Handler
from markupsafe import Markup

from dispatcher.api.operate import http_status
from dispatcher.api.problems import Problem
from dispatcher.console.session import Session, SessionSigner
from dispatcher.db.history import HistoryStore
from dispatcher.db.sessions import SessionRepository
from dispatcher.errors import DatabaseUnavailable
from dispatcher.operator.errors import OperatorError

log = logging.getLogger(__name__)

PREFIX = "/console"
STATIC = Path(__file__).parent / "static"
COOKIE = "dispatcher_console"
LOGIN_COOKIE = "dispatcher_console_login"
LOGIN_COOKIE_S = 600  # the login form must be sent within 10 minutes of being shown

API: web.AppKey[web.Application] = web.AppKey("console_api", web.Application)
SIGNER: web.AppKey[SessionSigner] = web.AppKey("console_signer", SessionSigner)
HISTORY: web.AppKey[HistoryStore] = web.AppKey("console_history", HistoryStore)
SESSIONS: web.AppKey[SessionRepository] = web.AppKey("console_sessions", SessionRepository)
# Where a request's session is kept (typed keys for requests exist from aiohttp 3.12 on).
SESSION: Any = (
    web.RequestKey("console_session", Session) if hasattr(web, "RequestKey") else "console_session"
)

SECURITY_HEADERS = {
    # no inline script or style, nothing from elsewhere, no framing, forms post only here
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
# Characters that would change how text reads without being visible: C0/C1 controls (tab and
# newline excepted), zero-width and bidirectional formatting, line/paragraph separators, BOM.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb]"
)


def printable(value: str) -> str:
    """`value` with every invisible or direction-changing character written as `\\uXXXX`."""
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)


def finalize(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


# A console route: method, path, handler (dispatcher.console.pages.ROUTES).
Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]


# handler markers ------------------------------------------------------------------------------
def public(handler: Handler) -> Handler:
    """A page anyone may fetch (the sign-in form)."""
    handler.console_public = True  # type: ignore[attr-defined]
    return handler


def operate(handler: Handler) -> Handler:
    """A page that acts (or asks to confirm an action, running its dry run): needs `operate`."""
    handler.console_operate = True  # type: ignore[attr-defined]
    return handler


def session_of(request: web.Request) -> Session:
    session: Session = request[SESSION]
    return session


def api_of(request: web.Request) -> web.Application:
    return request.app[API]


# middlewares -----------------------------------------------------------------------------------
@web.middleware
async def headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Security headers on every answer; refusals rendered as pages, not problem documents."""
    try:
        response = await handler(request)
    except Problem as exc:
        response = error_page(request, exc.status, exc.detail)
    except OperatorError as exc:  # the operator service refused: its words, the API's status
        response = error_page(request, http_status(exc), exc.detail)
    except DatabaseUnavailable:
        response = error_page(request, 503, "The database is unavailable; try again shortly.")
    except web.HTTPException as exc:
        if exc.status < 400:
            for name, value in SECURITY_HEADERS.items():
                exc.headers[name] = value
            raise
        response = error_page(request, exc.status, exc.reason)
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    if not request.path.startswith(f"{PREFIX}/static/"):
        # pages hold CSRF tokens and job data: never stored by a browser or a proxy
        response.headers["Cache-Control"] = "no-store"
    return response


@web.middleware
async def session_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who is asking (the session cookie), whether they may, and for a POST whether the form
    came from this console (same origin, CSRF token of the session)."""
    if is_static(request):  # served to anyone: no session lookup (a database probe) for it
        return await handler(request)
    signer = request.app[SIGNER]
    route_handler = request.match_info.handler
    session = await current_session(request)
    issued = None
    if session is None and signer.open:  # no tokens: an anonymous session, set on the answer
        issued = signer.issue(None)
        session = signer.verify(issued)
    if session is None:
        if getattr(route_handler, "console_public", False):
            return await handler(request)
        return sign_in_first(request)
    request[SESSION] = session
    if request.method == "POST":
        refusal = await forged(request, signer, session)
        if refusal is not None:
            return refusal
    if "read" not in session.scopes:
        raise Problem(403, f"token {session.name!r} lacks the read scope the console needs")
    if getattr(route_handler, "console_operate", False) and not session.can_operate:
        log.warning(
            "console: token %r refused %s %s: it lacks scope operate",
            session.name, request.method, request.path, extra={"token": session.name},
        )  # fmt: skip
        raise Problem(
            403,
            f"token {session.name!r} is read-only: acting needs a token with the operate scope",
        )
    response = await handler(request)
    if issued is not None:
        set_session_cookie(request, response, issued, signer.ttl_s)
    # the action's audit line is the operator service's (dispatcher.operator.audit)
    return response


async def current_session(request: web.Request) -> Session | None:
    """The session the cookie stands for: signed, not expired, for a configured token, and,
    but for anonymous ones, not signed out or revoked on the server (one index probe)."""
    session = request.app[SIGNER].verify(request.cookies.get(COOKIE))
    if session is None or not session.on_server:
        return session
    if not await request.app[SESSIONS].is_active(session.id_hash, session.token_id):
        return None
    return session


def is_static(request: web.Request) -> bool:
    return request.path.startswith(f"{PREFIX}/static/")


def sign_in_first(request: web.Request) -> web.StreamResponse:
    if request.method == "GET" and not request.path.endswith(".json"):
        raise web.HTTPSeeOther(f"{PREFIX}/login?next={request.rel_url.path_qs}")
    raise Problem(401, "Not signed in, or the session expired: sign in again.")


async def forged(
    request: web.Request, signer: SessionSigner, session: Session
) -> web.Response | None:
    """Why this POST is refused as not coming from a console form, or None."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != request.host:
        return error_page(request, 403, "This form was not sent from this console.")
    form = await request.post()
    presented = form.get("csrf")
    if not isinstance(presented, str) or not signer.check_csrf(session, presented):
        return error_page(
            request, 403, "The form's CSRF token does not match this session; reload the page."
        )
    return None


def set_session_cookie(
    request: web.Request, response: web.StreamResponse, value: str, ttl_s: float
) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=int(ttl_s),
        path=f"{PREFIX}/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


# An error page's heading by status: what happened, in words (the status itself is below it).
HEADINGS = {
    400: "Bad request",
    401: "Not signed in",
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed here",
    409: "Conflict",
    413: "Too large",
    422: "Not accepted",
    429: "Too many requests",
    503: "Unavailable",
}


def error_page(request: web.Request, status: int, detail: str) -> web.Response:
    heading = HEADINGS.get(status, "Server error" if status >= 500 else "Not done")
    if status == 404 and detail == "Not Found":  # the router's words for an unknown address
        detail = "There is no console page at this address."
    context = base_context(request, heading)
    context.update(status=status, detail=detail, heading=heading)
    return render(request, "error.html", context, status=status)


# rendering -----------------------------------------------------------------------------------
def base_context(request: web.Request, title: str, nav: str = "") -> dict[str, Any]:
    session: Session | None = request.get(SESSION)
    signer = request.app[SIGNER]
    return {
        "title": title,
        "nav": nav,
        "prefix": PREFIX,
        "session": session,
        "open_console": signer.open,
        "can_operate": session is not None and session.can_operate,
        "csrf": signer.csrf_token(session) if session is not None else "",
    }


def render(
    request: web.Request, template: str, context: dict[str, Any], status: int = 200
) -> web.Response:
    return aiohttp_jinja2.render_template(template, request, context, status=status)
