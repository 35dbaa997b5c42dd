"""`dispatcher console sessions`: list the console's signed-in sessions, revoke one or all.

A revoked session ends at its next request on every daemon sharing the database (each console
request looks its session up). The listing shows each session's public id, its token's name,
the address it signed in from and its times; never the session id, which only the browser has.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module on every command: the driver only when used
    from dispatcher.db.sessions import SessionRepository, SessionRow

EXIT_FAILURE = 1


def add_commands(console: argparse.ArgumentParser) -> None:
    """The subcommands of `dispatcher console`."""
    actions = console.add_subparsers(dest="console_action", metavar="ACTION", required=True)
    sessions = actions.add_parser(
        "sessions",
        help="list signed-in console sessions; revoke one or all",
        description="List the console sessions that have not expired (no ACTION), or revoke "
        "them: a revoked session is refused at its next request, on every daemon.",
    )
    sessions.add_argument("--json", action="store_true", help="one JSON document for scripts")
    sub = sessions.add_subparsers(dest="sessions_action", metavar="ACTION")
    revoke = sub.add_parser("revoke", help="revoke one session (by its listed ID) or --all")
    target = revoke.add_mutually_exclusive_group(required=True)
    target.add_argument("id", nargs="?", type=int, help="the session's ID from the listing")
    target.add_argument("--all", action="store_true", help="revoke every session")


async def sessions_command(repo: SessionRepository, args: argparse.Namespace) -> int:
    """`dispatcher console sessions [revoke ID | revoke --all] [--json]` on `repo`."""
    if getattr(args, "sessions_action", None) == "revoke":
        return await revoke(repo, args)
    rows = await repo.live_sessions()
    if args.json:
        print(json.dumps({"sessions": [row_view(r) for r in rows]}, indent=2))
    else:
        print(format_sessions(rows))
    return 0


async def revoke(repo: SessionRepository, args: argparse.Namespace) -> int:
    if args.all:
        print(f"revoked {await repo.revoke_all()} session(s)")
        return 0
    if not await repo.revoke(args.id):
        print(
            f"dispatcher: no console session {args.id}; `dispatcher console sessions` lists them",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    print(f"revoked session {args.id}")
    return 0


def row_view(row: SessionRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "token": row.token_name,
        "client": row.client,
        "created_at": row.created_at.isoformat(),
        "expires_at": row.expires_at.isoformat(),
    }


def format_sessions(rows: list[SessionRow]) -> str:
    if not rows:
        return "no console sessions"
    lines = [f"{'ID':>8}  {'TOKEN':<24} {'FROM':<40} {'SIGNED IN':<20} EXPIRES"]
    for r in rows:
        lines.append(
            f"{r.id:>8}  {r.token_name:<24} {r.client:<40} "
            f"{r.created_at:%Y-%m-%d %H:%M:%S}Z  {r.expires_at:%Y-%m-%d %H:%M:%S}Z"
        )
    return "\n".join(lines)
