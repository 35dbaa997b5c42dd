"""The `http` effect: push a job's payload as JSON to its target URL, signed, and classify
the response into success, retry later or reject.

Every attempt of a job sends the same `Idempotency-Key` and `webhook-id` (the job key), so a
receiver can drop the duplicates that at-least-once delivery produces. Redirects are never
followed (the redirect target was not checked by the SSRF guard and may not be idempotent).
Each request is one write of bytes built once (the target's part once per target, the job's
part once per attempt) over a pooled keep-alive connection (`httpclient`).
With tracing on, each request carries the attempt span's W3C `traceparent` (replacing one the
target's own headers may set), so the target's trace joins the producer's.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import UTC
from email.utils import parsedate_to_datetime
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple, NoReturn

from multidict import CIMultiDict
from yarl import URL

from dispatcher.config.settings import Settings
from dispatcher.config.signing_secret import SigningSecret
from dispatcher.core import jsoncodec
from dispatcher.effects.base import Delivered
from dispatcher.effects.httpclient import HttpClient, HttpClientError, Origin
from dispatcher.effects.signing import SignerSet
from dispatcher.effects.ssrf import GuardedResolver, TargetPolicy, TargetRefused
from dispatcher.errors import ConfigError, Reject, RetryLater
from dispatcher.model import Job
from dispatcher.observability.metrics import HTTP_RESPONSES
from dispatcher.observability.tracing import TRACEPARENT, current_traceparent

log = logging.getLogger("dispatcher.http")

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
# The response header a target stops retrying with (`Dispatcher-Retry: abort`), as Svix's
# `webhook-delivery: abort-message`: the job is dead at once, whatever the status.
RETRY_CONTROL = "Dispatcher-Retry"
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_SIGNED_INTEGER = re.compile(r"^-?[0-9]+\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
MAX_PREPARED_TARGETS = 4096
# The body's bytes are exactly json.dumps(payload, separators=(",", ":")), from an encoder
# built once: json.dumps builds one per call for non-default arguments, and `encode` still
# builds its C encoder per call (together ~8 of 11 µs per small payload, measured). No
# circular-reference check: a payload decoded from jsonb cannot hold a cycle.
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_C_ENCODER = (
    c_make_encoder(
        None, _ENCODER.default, encode_basestring_ascii, None, ":", ",", False, False, True
    )
    if c_make_encoder is not None
    else None
)


def _encode(payload: Any) -> bytes:
    try:
        if _C_ENCODER is not None:
            return "".join(_C_ENCODER(payload, 0)).encode()
        return _ENCODER.encode(payload).encode()
    except ValueError as exc:  # an integer past Python's 4,300 digits: written exactly
        if not jsoncodec.is_long_integer_error(exc):
            raise
        return jsoncodec.dumps_long_integers(payload, separators=(",", ":")).encode()


def _target_key(target: Any) -> Hashable | None:
    """A hashable image of a stored target (a JSON object), with each value's type, so that
    targets alike only in Python's eyes (`1`, `1.0` and `true` compare equal) never share an
    entry; None when it holds something unexpected (then it is checked uncached)."""
    if not isinstance(target, dict):
        return None
    items: list[tuple[str, type, Any]] = []
    for name, value in target.items():
        if isinstance(value, dict):
            if not all(isinstance(v, str) for v in value.values()):
                return None
            value = tuple(value.items())
        elif isinstance(value, list):
            return None
        items.append((name, type(value), value))
    return tuple(items)


class _Prepared(NamedTuple):
    """What every request to one normalized target shares, built once: where it goes, and
    its request line and fixed headers, encoded."""

    origin: Origin
    head: bytes  # request line, Host, User-Agent, Accept, the target's headers, Content-Type
    timeout_s: float
    traceparent: str | None  # the target's own traceparent header (tracing may replace it)


class HttpEffect:
    """Pushes jobs over one pooled keep-alive client (`httpclient.HttpClient`).

    Invariants: the client only connects to addresses the SSRF policy allows (literal ones
    checked by `check_url` and again before connecting, names through the guarded resolver),
    keeps no cookies and uses no proxy, so one job can never influence another's request.
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
        # read and checked now, not on the first job; SIGHUP replaces them (use_secrets)
        self._signers: SignerSet | None = None
        self.use_secrets(settings.signing_secrets())
        self._ssl_context = ssl_context
        self._clock = clock
        self._client: HttpClient | None = None
        self._resolver: GuardedResolver | None = None
        self._excerpt_bytes = settings.http.response_excerpt_bytes
        self._user_agent = settings.http.user_agent
        # normalized and prepared targets, by the stored target's content (see _target_key)
        self._prepared: OrderedDict[Hashable, _Prepared | Reject] = OrderedDict()
        self._counters: dict[tuple[str, str], Any] = {}

    def use_secrets(self, secrets: Sequence[SigningSecret]) -> None:
        """Sign from now on with `secrets` (the primary first; none: unsigned), as the
        configuration read them at start or a SIGHUP read them again."""
        self._signers = SignerSet(secrets) if secrets else None

    def reload_secrets(self) -> None:
        """SIGHUP: read `http.signing_secret_file` again. A file that cannot be used changes
        nothing (the secrets in use keep signing) and is logged, naming its line."""
        try:
            secrets = self._settings.signing_secrets()
        except ValueError as exc:  # names the file and line, never a secret
            log.error("SIGHUP: %s; the signing secrets in use stay", exc)
            return
        self.use_secrets(secrets)
        described = ", ".join(s.describe() for s in secrets)
        log.info("SIGHUP: signing secrets reloaded: %s", described)

    async def start(self) -> None:
        if self._client is not None:
            return
        self._resolver = GuardedResolver(self._policy)
        self._client = HttpClient(
            self._resolver,
            self._policy,
            self._ssl_context if self._ssl_context is not None else ssl.create_default_context(),
            self._settings.http.max_connections,
        )

    async def stop(self) -> None:
        client, resolver = self._client, self._resolver
        self._client = self._resolver = None
        if client is not None:
            await client.close()
        if resolver is not None:
            await resolver.close()

    async def run(self, job: Job, complete: Any, conn: Any = None) -> dict[str, Any]:
        """One attempt. `complete` is unused: the executor records completion afterwards."""
        del complete
        target = self._target(job)
        try:
            status, headers, excerpt = await self._send(job, target)
        except TargetRefused as exc:  # from the resolver: a name resolved to a refused address
            self._count(job, "error")
            raise Reject(f"target refused: {exc}", code="target_refused") from None
        except (TimeoutError, HttpClientError) as exc:
            self._count(job, "error")
            _raise_transport_failure(exc, target.timeout_s)
        self._count(job, _status_class(status))
        return classify(status, headers, excerpt, self._clock())

    def _target(self, job: Job) -> _Prepared:
        """The job's target, checked again on every attempt (the policy may have changed since
        intake) and prepared: both cached by the target's content, as a daemon sends the same
        few targets over and over."""
        key = _target_key(job.target)
        prepared = self._prepared.get(key) if key is not None else None
        if prepared is None:
            prepared = self._prepare(job.target)
            if key is not None:
                self._prepared[key] = prepared
                if len(self._prepared) > MAX_PREPARED_TARGETS:
                    self._prepared.popitem(last=False)
        if isinstance(prepared, Reject):
            self._count(job, "error")
            raise Reject(prepared.reason, code=prepared.code)
        return prepared

    def _prepare(self, stored: Any) -> _Prepared | Reject:
        try:
            target = normalize_target(stored, self._settings, self._policy)
        except TargetRefused as exc:
            return Reject(f"target refused: {exc}", code="target_refused")
        except ValueError as exc:
            return Reject(f"invalid target: {exc}", code="invalid_target")
        url = URL(target["url"])
        host = url.raw_host or ""
        tls = url.scheme == "https"
        port = url.port or (443 if tls else 80)
        netloc = f"[{host}]" if ":" in host else host
        if url.explicit_port is not None and url.explicit_port != (443 if tls else 80):
            netloc += f":{url.explicit_port}"
        own: CIMultiDict[str] = CIMultiDict({"User-Agent": self._user_agent, "Accept": "*/*"})
        own.update(target["headers"])  # may replace both; reserved names were refused earlier
        traceparent = own.popone(TRACEPARENT, None)
        lines = [f"{target['method']} {url.raw_path_qs or '/'} HTTP/1.1", f"Host: {netloc}"]
        lines += [f"{name}: {value}" for name, value in own.items()]
        lines.append("Content-Type: application/json")
        head = ("\r\n".join(lines) + "\r\n").encode()
        return _Prepared(Origin(tls, host, port), head, target["timeout_s"], traceparent)

    async def _send(self, job: Job, target: _Prepared) -> tuple[int, Mapping[str, str], str]:
        if self._client is None:
            raise RuntimeError("HttpEffect.start() must be awaited before run()")
        request = self._request(job, target, _encode(job.payload))
        # The request carries the payload now: the decoded copy is not needed by this attempt
        # any more (a retry is another claim, another Job), and while the target answers it
        # was the second copy of every payload in flight (issue 20: 1.5 copies per job).
        job.payload = {}
        response = await self._client.request(
            target.origin, request, target.timeout_s, self._excerpt_bytes
        )
        return response.status, response.headers, _excerpt(response.excerpt, self._excerpt_bytes)

    def _request(self, job: Job, target: _Prepared, body: bytes) -> bytes:
        """The whole request, encoded once: the target's prepared head, then what differs per
        job (Idempotency-Key and the Standard Webhooks headers; traceparent), then the body."""
        key = job.key
        if "\r" in key or "\n" in key:  # what aiohttp refused too: a header injection
            raise ValueError("the job key holds a line break; it cannot be a header value")
        now = self._clock()
        timestamp = int(now)
        encoded_key = key.encode()
        parts = [
            target.head,
            b"Idempotency-Key: %s\r\nwebhook-id: %s\r\nwebhook-timestamp: %d\r\n"
            % (encoded_key, encoded_key, timestamp),
        ]
        if self._signers is not None:
            signature = self._signers.signature_bytes(encoded_key, timestamp, body, now)
            parts.append(b"webhook-signature: %s\r\n" % signature)
        traceparent = target.traceparent
        if self._trace_context and (current := current_traceparent()) is not None:
            traceparent = current
        if traceparent is not None:
            parts.append(b"traceparent: %s\r\n" % traceparent.encode())
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        parts.append(body)
        return b"".join(parts)

    def _count(self, job: Job, status_class: str) -> None:
        counter = self._counters.get((job.queue, status_class))
        if counter is None:
            counter = HTTP_RESPONSES.labels(job.queue, status_class)
            self._counters[(job.queue, status_class)] = counter
        counter.inc()

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


def _excerpt(data: bytes, limit: int) -> str:
    """Up to `limit` bytes of the body as text, for the error text; the client read one byte
    more to know whether it is truncated."""
    if limit <= 0:
        return ""
    text = data[:limit].decode("utf-8", errors="replace")
    return text + "…" if len(data) > limit else text


def classify(status: int, headers: Mapping[str, str], excerpt: str, now: float) -> Delivered:
    """Success summary for 2xx; otherwise raise RetryLater or Reject with the status and body.

    A target stops the retries of its job with `Dispatcher-Retry: abort` on any other status:
    the job is dead at once as `receiver_abort`. `Retry-After` is read on every status that is
    retried (408, 429, 5xx, an unexpected one) and on a 3xx: on 429 and 503 it is a rate limit
    (the queue's backoff when it is absent or unreadable). It is honoured without a cap of its
    own: the job's retry age bounds it (record_failure decides)."""
    if 200 <= status < 300:
        return Delivered({"status": status}, http_status=status, excerpt=excerpt)
    reason = f"HTTP {status}" + (f": {excerpt}" if excerpt else "")
    if headers.get(RETRY_CONTROL, "").strip().lower() == "abort":
        raise Reject(
            f"the target answered {RETRY_CONTROL}: abort with {reason}",
            code="receiver_abort",
            http_status=status,
        )
    retry_after_s = None
    if not (400 <= status < 500) or status in (408, 429):
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
    raise RetryLater(f"unexpected {reason}", retry_after_s, retry_after=asked, http_status=status)


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
