"""What every settings section builds on: the strict base model, the shared bounds and the
helpers for secrets (read from a file, masked in a URL)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

# No duration setting may exceed ten years: every one must stay a finite time when the
# database adds it to now().
MAX_DURATION_S = 10 * 365 * 86400
# Limits every door accepts (file, API, CLI): finite, and within the database's integer and
# float columns (a burst past 2**31 - 1 failed the registry write at start, or a PUT with a 500)
MAX_RATE_PER_S = 1e9  # far above anything one database can start
MAX_BURST = 2_147_483_647
NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,62}$"
PositiveFloat = Annotated[float, Field(gt=0)]


class Strict(BaseModel):
    """A settings section: unknown names are errors, values never change after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)


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
