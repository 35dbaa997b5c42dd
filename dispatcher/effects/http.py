"""The `http` effect: push a job's payload as JSON to its target URL, signed, and classify
the response into success, retry later or reject.

Every attempt of a job sends the same `Idempotency-Key` and `webhook-id` (the job key), so a
receiver can drop the duplicates that at-least-once delivery produces. Redirects are never
followed (the redirect target was not checked by the SSRF guard and may not be idempotent).
With tracing on, each request carries the attempt span's W3C `traceparent` (replacing one the
target's own headers may set), so the target's trace joins the producer's.
"""

from __future__ import annotations

import functools
import json
import math
import re
import ssl
import time
from collections.abc import Callable, Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from dispatcher.config import Settings
from dispatcher.effects.base import Delivered
from dispatcher.effects.signing import webhook_headers
from dispatcher.effects.ssrf import GuardedResolver, TargetPolicy, TargetRefused
from dispatcher.errors import ConfigError, Reject, RetryLater
from dispatcher.metrics import HTTP_RESPONSES
from dispatcher.model import Job
from dispatcher.signing_secret import decode_secret
from dispatcher.tracing import TRACEPARENT, current_traceparent

METHODS = ("POST", "PUT", "PATCH")
TARGET_KEYS = ("url", "method", "headers", "timeout_s")
# Headers the effect owns: overriding them would break framing, signing or deduplication.
RESERVED_HEADERS = frozenset(
    {"content-type", "content-length", "host", "idempotency-key", "transfer-encoding", "connection"}
)
RESERVED_HEADER_PREFIX = "webhook-"
MAX_TARGET_HEADERS = 32
MAX_HEADER_VALUE_CHARS = 8192
MAX_URL_CHARS = 4096
MAX_LOCATION_CHARS = 512
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_SIGNED_INTEGER = re.compile(r"^-?[0-9]+\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

Response = tuple[int, CIMultiDictProxy[str], str]


class HttpEffect:
    """Pushes jobs over one pooled aiohttp session.

    Invariants: the session only connects through the SSRF-guarded resolver, keeps no cookies
    and ignores proxy environment variables, so one job can never influence another's request.
    """

    completes_in_transaction = False

    def __init__(
        self,
        settings: Settings,
        *,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
        trace_context: bool = False,
    ) -> None:
        self._settings = settings
        self._trace_context = trace_context  # send the current span as traceparent
        self._policy = TargetPolicy.from_settings(settings)
        self._secret = settings.signing_secret()
        if self._secret is not None:
            decode_secret(self._secret)  # fail at start, not on the first job
        self._ssl_context = ssl_context
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._resolver: GuardedResolver | None = None

    async def start(self) -> None:
        if self._session is not None:
            return
        self._resolver = GuardedResolver(self._policy)
        connector = aiohttp.TCPConnector(
            limit=self._settings.http.max_connections,
            resolver=self._resolver,
            ssl=self._ssl_context if self._ssl_context is not None else True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
        )

    async def stop(self) -> None:
        session, resolver = self._session, self._resolver
        self._session = self._resolver = None
        if session is not None:
            await session.close()
        if resolver is not None:
            await resolver.close()

    async def run(self, job: Job, complete: Any, conn: Any = None) -> dict[str, Any]:
        """One attempt. `complete` is unused: the executor records completion afterwards."""
        del complete
        target = self._target(job)
        try:
            status, headers, excerpt = await self._send(job, target)
        except TargetRefused as exc:  # from the resolver: a name resolved to a refused address
            _count(job, "error")
            raise Reject(f"target refused: {exc}", code="target_refused") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            _count(job, "error")
            _raise_transport_failure(exc, target["timeout_s"])
        _count(job, _status_class(status))
        return classify(status, headers, excerpt, self._clock())

    def _target(self, job: Job) -> dict[str, Any]:
        # Checked again on every attempt: the policy may have changed since intake.
        try:
            return normalize_target(job.target, self._settings, self._policy)
        except TargetRefused as exc:
            _count(job, "error")
            raise Reject(f"target refused: {exc}", code="target_refused") from None
        except ValueError as exc:
            _count(job, "error")
            raise Reject(f"invalid target: {exc}", code="invalid_target") from None

    async def _send(self, job: Job, target: Mapping[str, Any]) -> Response:
        if self._session is None:
            raise RuntimeError("HttpEffect.start() must be awaited before run()")
        body = json.dumps(job.payload, separators=(",", ":")).encode()
        async with self._session.request(
            target["method"],
            URL(target["url"]),
            data=body,
            headers=self._headers(job, target["headers"], body),
            timeout=aiohttp.ClientTimeout(total=target["timeout_s"]),
            allow_redirects=False,
        ) as response:
            excerpt = await _read_excerpt(response, self._settings.http.response_excerpt_bytes)
            return response.status, response.headers, excerpt

    def _headers(self, job: Job, own: Mapping[str, str], body: bytes) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict({"User-Agent": self._settings.http.user_agent})
        headers.update(own)  # may replace User-Agent; reserved names were refused earlier
        headers["Content-Type"] = "application/json"
        headers["Idempotency-Key"] = job.key
        timestamp = int(self._clock())
        headers.update(webhook_headers(self._secret, job.key, timestamp, body))
        if self._trace_context and (traceparent := current_traceparent()) is not None:
            headers[TRACEPARENT] = traceparent
        return headers

    @staticmethod
    def validate_target(target: Any, settings: Settings) -> dict[str, Any]:
        """The normalized target for intake; ValueError (TargetRefused for SSRF) says what
        to fix."""
        return normalize_target(target, settings, TargetPolicy.from_settings(settings))


def dead_letter_target(settings: Settings, queue: str) -> dict[str, Any] | None:
    """The normalized http target of `queue`'s dead-letter notifications, or None;
    ValueError names the setting and the fix."""
    notice = settings.queues[queue].on_dead
    if notice is None:
        return None
    where = f"queues.{queue}.on_dead"
    env = f"DISPATCHER_QUEUES__{queue.upper()}__ON_DEAD"
    if notice.queue is not None and notice.queue not in settings.queues:
        known = ", ".join(sorted(settings.queues))
        raise ValueError(
            f"{where}.queue: {notice.queue!r} is not in [queues] (configured: {known}) "
            f"(env {env}__QUEUE)"
        )
    try:
        return normalize_target({"url": notice.url}, settings, TargetPolicy.from_settings(settings))
    except ValueError as exc:
        raise ValueError(f"{where}.url: {exc} (env {env}__URL)") from None


def verify_dead_letter_targets(settings: Settings) -> None:
    """Every `on_dead` target passes the checks intake applies to an http job's target (scheme,
    SSRF guard), so a notification can never be refused later for its URL. Checked when the
    configuration is (`run`, `check-config`), beside the handlers: the configuration itself
    cannot, as these rules live here, above it."""
    for queue in settings.queues:
        try:
            dead_letter_target(settings, queue)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def normalize_target(target: Any, settings: Settings, policy: TargetPolicy) -> dict[str, Any]:
    """Check an http job's target and fill in defaults: {url, method, headers, timeout_s}."""
    if not isinstance(target, Mapping):
        raise ValueError('an http job needs target = {"url": "https://..."}')
    unknown = sorted(str(key) for key in target if key not in TARGET_KEYS)
    if unknown:
        raise ValueError(f"target has unknown keys {unknown}; allowed: {list(TARGET_KEYS)}")
    return {
        "url": _url(target.get("url"), policy),
        "method": _method(target.get("method", "POST")),
        "headers": _own_headers(target.get("headers", {})),
        "timeout_s": _timeout(target.get("timeout_s"), settings),
    }


def _url(value: Any, policy: TargetPolicy) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError('target.url is required: a string like "https://host/path"')
    if len(value) > MAX_URL_CHARS:
        raise ValueError(f"target.url is longer than {MAX_URL_CHARS} characters")
    refusal = _url_refusal(policy, value)
    if refusal is not None:
        raise TargetRefused(f"target.url: {refusal}")
    return value


@functools.lru_cache(maxsize=4096)
def _url_refusal(policy: TargetPolicy, url: str) -> str | None:
    """Why `policy` refuses `url`, or None. Cached: intake and every attempt check the same few
    URLs over and over (addresses a name resolves to are checked at connect time, uncached)."""
    try:
        policy.check_url(url)
    except TargetRefused as exc:
        return str(exc)
    return None


def _method(value: Any) -> str:
    method = value.upper() if isinstance(value, str) else value
    if method not in METHODS:
        raise ValueError(f"target.method {value!r} is not allowed; use one of {list(METHODS)}")
    return str(method)


def _own_headers(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError('target.headers must be an object of strings, like {"X-Team": "a"}')
    if len(value) > MAX_TARGET_HEADERS:
        raise ValueError(f"target.headers has more than {MAX_TARGET_HEADERS} entries")
    for name, header_value in value.items():
        _check_header(name, header_value)
    return dict(value)


def _check_header(name: Any, value: Any) -> None:
    if not isinstance(name, str) or not _TOKEN.match(name):
        raise ValueError(f"target.headers: {name!r} is not a valid header name")
    lowered = name.lower()
    if lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_HEADER_PREFIX):
        raise ValueError(
            f"target.headers: {name} is set by the dispatcher and cannot be overridden "
            f"(reserved: {sorted(RESERVED_HEADERS)} and {RESERVED_HEADER_PREFIX}*)"
        )
    if not isinstance(value, str):
        raise ValueError(f"target.headers.{name} must be a string")
    if len(value) > MAX_HEADER_VALUE_CHARS or _CONTROL.search(value):
        raise ValueError(
            f"target.headers.{name} must be at most {MAX_HEADER_VALUE_CHARS} characters "
            "without control characters (no line breaks)"
        )


def _timeout(value: Any, settings: Settings) -> float:
    if value is None:
        return settings.http.default_timeout_s
    limit = settings.http.max_timeout_s
    # bool is an int subclass; `true` as a timeout is a mistake, not 1 second.
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not valid or not 0 < value <= limit:
        raise ValueError(f"target.timeout_s must be a number of seconds > 0 and <= {limit:g}")
    return float(value)


async def _read_excerpt(response: aiohttp.ClientResponse, limit: int) -> str:
    """Up to `limit` bytes of the body, for the error text; reading fails soft (it is only
    a diagnostic, and the status already decided the outcome)."""
    if limit <= 0:
        return ""
    data = bytearray()
    try:
        # Read one byte past the limit to know whether the excerpt is truncated.
        while len(data) <= limit:
            chunk = await response.content.read(limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except (TimeoutError, aiohttp.ClientError):
        pass
    text = bytes(data[:limit]).decode("utf-8", errors="replace")
    return text + "…" if len(data) > limit else text


def classify(status: int, headers: Mapping[str, str], excerpt: str, now: float) -> Delivered:
    """Success summary for 2xx; otherwise raise RetryLater or Reject with the status and body.

    `Retry-After` is read on every 429 and 503 (rate limited: the queue's backoff when it is
    absent or unreadable) and on any other 3xx or 5xx that sends it. It is honoured without a
    cap of its own: the job's retry age bounds it (record_failure decides)."""
    if 200 <= status < 300:
        return Delivered({"status": status}, http_status=status, excerpt=excerpt)
    reason = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
    retry_after_s = None
    if status == 429 or 300 <= status < 400 or 500 <= status < 600:
        retry_after_s = parse_retry_after(headers.get("Retry-After"), now)
    asked = retry_after_s is not None
    if 300 <= status < 400:
        location = headers.get("Location", "(no Location header)")[:MAX_LOCATION_CHARS]
        redirect = f"HTTP {status}: redirect to {location} not followed"
        response = f"; response: {excerpt}" if excerpt else ""
        if asked:  # "come back later" (maintenance): the same URL is tried again then
            raise RetryLater(
                f"{redirect}; the target asked to retry after {retry_after_s:g} s{response}",
                retry_after_s,
                retry_after=True,
                http_status=status,
            )
        raise Reject(
            f"{redirect}; point the job at the final URL{response}",
            code="http_3xx",
            http_status=status,
        )
    if status in (429, 503):
        raise RetryLater(
            reason, retry_after_s, rate_limited=True, retry_after=asked, http_status=status
        )
    if status == 408 or 500 <= status < 600:
        raise RetryLater(reason, retry_after_s, retry_after=asked, http_status=status)
    if 400 <= status < 500:
        raise Reject(reason, code="http_4xx", http_status=status)
    raise RetryLater(f"unexpected {reason}", http_status=status)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP date), at least 0 and
    with no upper cap (a huge value may be infinite: the executor clamps it, and the job's
    retry age decides); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if _SIGNED_INTEGER.match(value):
        delay_s = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000" zone; HTTP dates are always GMT
            when = when.replace(tzinfo=UTC)
        delay_s = when.timestamp() - now
    if math.isnan(delay_s):
        return None
    return max(delay_s, 0.0)


def _raise_transport_failure(exc: BaseException, timeout_s: float) -> NoReturn:
    if isinstance(exc, TimeoutError):
        raise RetryLater(f"no response within {timeout_s:g} s (timeout)") from exc
    raise RetryLater(f"{type(exc).__name__}: {exc}") from exc


def _status_class(status: int) -> str:
    return f"{status // 100}xx" if 200 <= status < 600 else "error"


def _count(job: Job, status_class: str) -> None:
    HTTP_RESPONSES.labels(job.queue, status_class).inc()
