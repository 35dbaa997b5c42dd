"""The console's aiohttp application: its routes, sign-in and sign-out, and where it is
mounted (under /console/ on the API listener, or on a listener of its own).

The scripts are static files (Content-Security-Policy allows no inline script):
static/console.js polls `live.json` for the overview's counters and fetches the history charts
(dispatcher.console.charts) again every 10 s; static/live.js refreshes the parts of the other
pages marked `data-live-region` while they are visible.
The toolkit the pages share (keys, middlewares, rendering, `printable`) is
dispatcher.console.toolkit.
"""

from __future__ import annotations

import logging

import aiohttp_jinja2
import jinja2
from aiohttp import web

from dispatcher.api.app import authenticate, client_of
from dispatcher.api.keys import GUESSES, OWN_AUTH, REPO, TOKENS
from dispatcher.config.tokens import ApiToken
from dispatcher.console import pages, queue_page
from dispatcher.console.session import SessionSigner
from dispatcher.console.toolkit import (
    API,
    COOKIE,
    HISTORY,
    LOGIN_COOKIE,
    LOGIN_COOKIE_S,
    PREFIX,
    SESSIONS,
    SIGNER,
    STATIC,
    base_context,
    finalize,
    headers_middleware,
    public,
    render,
    session_middleware,
    session_of,
    set_session_cookie,
)
from dispatcher.db.history import HistoryStore
from dispatcher.db.sessions import SessionRepository
from dispatcher.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


# sign in and out ---------------------------------------------------------------------------
def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if value and value.startswith(f"{PREFIX}/") and "\\" not in value and "//" not in value:
        return value
    return f"{PREFIX}/"


@public
async def login_form(request: web.Request) -> web.StreamResponse:
    return login_page(request, "", 200)


def login_page(request: web.Request, error: str, status: int) -> web.Response:
    signer = request.app[SIGNER]
    nonce = signer.new_login_nonce()
    context = base_context(request, "Sign in")
    context.update(
        error=error, login_csrf=signer.login_csrf(nonce), next=safe_next(request.query.get("next"))
    )
    response = render(request, "login.html", context, status=status)
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=LOGIN_COOKIE_S,
        path=f"{PREFIX}/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )
    return response


@public
async def login(request: web.Request) -> web.StreamResponse:
    signer = request.app[SIGNER]
    form = await request.post()
    csrf, token_text = form.get("csrf"), form.get("token")
    if not signer.check_login_csrf(
        request.cookies.get(LOGIN_COOKIE), csrf if isinstance(csrf, str) else None
    ):
        return login_page(request, "The sign-in form expired; enter the token again.", 403)
    if signer.open:
        raise web.HTTPSeeOther(f"{PREFIX}/")  # no tokens: nothing to sign in with
    guesses, client = request.app[API][GUESSES], client_of(request.app[API], request)
    if (wait_s := guesses.retry_after_s(client)) is not None:
        response = login_page(
            request,
            f"Too many failed sign-ins from your address: try again in {wait_s} s.",
            429,
        )
        response.headers["Retry-After"] = str(wait_s)
        return response
    token = None
    if isinstance(token_text, str) and token_text.strip():
        token = authenticate(request.app[API][TOKENS], f"Bearer {token_text.strip()}")
    if token is None:
        guesses.failed(client, "console sign-in")  # logged once per burst, not per attempt
        return login_page(request, "That token is not one of this dispatcher's API tokens.", 401)
    if "read" not in token.scopes:
        return login_page(
            request, f"Token {token.name!r} lacks the read scope the console needs.", 403
        )
    next_url = form.get("next")
    response = web.HTTPSeeOther(safe_next(next_url if isinstance(next_url, str) else None))
    cookie = signer.issue(token)
    session = signer.verify(cookie)
    assert session is not None  # just issued
    await request.app[SESSIONS].create(
        session.id_hash, session.token_id, session.name, client, session.expires_at
    )
    log.info("console: %r signed in from %s", token.name, client, extra={"token": token.name})
    set_session_cookie(request, response, cookie, signer.ttl_s)
    response.del_cookie(LOGIN_COOKIE, path=f"{PREFIX}/")
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    """Ends the session on the server (every copy of the cookie), not only in this browser."""
    session = session_of(request)
    if session.on_server:
        await request.app[SESSIONS].end(session.id_hash)
        log.info("console: %r signed out", session.name, extra={"token": session.name})
    response = web.HTTPSeeOther(f"{PREFIX}/login")
    response.del_cookie(COOKIE, path=f"{PREFIX}/")
    raise response


# the application -------------------------------------------------------------------------------


def create_console(api: web.Application, session_ttl_s: float) -> web.Application:
    """The console as an application to mount at /console (`mount` or `standalone`). `api` is
    the API application: the console reads its keys and calls its actions."""
    app = web.Application(middlewares=[headers_middleware, session_middleware])
    app[OWN_AUTH] = True
    app[API] = api
    app[HISTORY] = HistoryStore(api[REPO].pool)
    tokens: list[ApiToken] = api[TOKENS]
    app[SIGNER] = SessionSigner(tokens, session_ttl_s)
    app[SESSIONS] = SessionRepository(api[REPO].pool)
    app.on_startup.append(end_sessions_of_removed_tokens)
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("dispatcher.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    pages.add_filters(env)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    for method, path, handler in [*queue_page.ROUTES, *pages.ROUTES]:
        app.router.add_route(method, path, handler)
    app.router.add_static("/static/", STATIC, append_version=False)
    return app


async def end_sessions_of_removed_tokens(app: web.Application) -> None:
    """At start: delete the sessions of tokens no longer configured (and expired ones). They
    are refused anyway (each request checks its token against the configured ones); this keeps
    them out of `dispatcher console sessions`. Daemons sharing a database share its tokens."""
    try:
        ended = await app[SESSIONS].revoke_other_tokens(app[SIGNER].token_ids())
    except DatabaseUnavailable as exc:
        log.warning("console: could not end the sessions of removed tokens: %s", exc)
        return
    if ended:
        log.info("console: ended %d session(s) of tokens no longer configured", ended)


def mount(api: web.Application, session_ttl_s: float) -> None:
    """Serve the console at /console/ on the API's own listener; / and /console lead to it
    (a browser pointed at the daemon's address finds the console, not a 404)."""
    # /console before the sub-application: aiohttp strips a sub-application's trailing slash,
    # so registered after it, /console went to the console's sign-in, not to /console/
    api.router.add_get("/", to_console)
    api.router.add_get(PREFIX, to_console)
    api.add_subapp(f"{PREFIX}/", create_console(api, session_ttl_s))


def standalone(api: web.Application, session_ttl_s: float) -> web.Application:
    """An application serving only the console (DISPATCHER_CONSOLE_LISTEN); / leads to it."""
    root = web.Application()
    root.router.add_get("/", to_console)
    root.router.add_get(PREFIX, to_console)
    root.add_subapp(f"{PREFIX}/", create_console(api, session_ttl_s))
    return root


async def to_console(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(f"{PREFIX}/")


to_console.own_auth = True  # type: ignore[attr-defined]  # a redirect: nothing to protect
