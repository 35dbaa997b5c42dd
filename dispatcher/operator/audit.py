"""Who did what: the actor of an operator action and the one audit line each action writes."""

from __future__ import annotations

import getpass
import logging
from dataclasses import dataclass

log = logging.getLogger("dispatcher.operator")


@dataclass(frozen=True)
class Actor:
    """Who asks: a token's name (never the token) at the API or the console, or the OS user
    at the command line."""

    name: str
    door: str  # "api", "console" or "cli"

    @classmethod
    def cli(cls) -> Actor:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry and no LOGNAME (a bare container)
            user = "unknown user"
        return cls(user, "cli")

    def __str__(self) -> str:
        return f"{self.name!r} ({self.door})"


def record(actor: Actor, action: str, subject: str, outcome: str) -> None:
    """The audit line: `operator action <action> <subject> by <actor>: <outcome>`."""
    token = actor.name if actor.door != "cli" else None
    log.info(
        "operator action %s %s by %s: %s",
        action,
        subject,
        actor,
        outcome,
        extra={"token": token, "actor": actor.name, "door": actor.door},
    )
