"""The effects' sections: `[handlers.NAME]` (python and sql handlers) and `[http]` (the HTTP
push effect)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from dispatcher.config.base import MAX_DURATION_S, Strict
from dispatcher.config.signing_secret import SigningSecret, parse_secrets


class HandlerSettings(Strict):
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


class HttpSettings(Strict):
    """The HTTP push effect."""

    # Standard Webhooks secrets: one per line of the file (dispatcher.config.signing_secret
    # has the format), or `;`-separated entries inline; the first is the primary.
    signing_secret: SecretStr | None = None
    signing_secret_file: Path | None = None
    # How long `dispatcher signing-secret rotate` keeps signing with the old primary beside
    # the new one: receivers have this long to switch to the new secret.
    signing_secret_overlap_s: float = Field(86_400.0, ge=0, le=MAX_DURATION_S)
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
            inline_secrets(value)  # ValueError naming the entry, never the secret
        return value


def inline_secrets(value: SecretStr) -> list[SigningSecret]:
    """The secrets of the inline `http.signing_secret`: the file's format, with entries
    separated by `;` (an environment variable holds one line)."""
    text = value.get_secret_value().replace(";", "\n")
    return parse_secrets(text, "http.signing_secret", unit="entry")
