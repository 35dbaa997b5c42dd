"""`dispatcher signing-secret`: list the webhook signing secrets in use, rotate the primary.

`rotate` writes a new random primary at the top of `http.signing_secret_file` and keeps the old
primary for `http.signing_secret_overlap_s` (a `not-after` time on its line, so the overlap
holds across restarts), drops the secrets whose overlap has ended, and replaces the file
atomically with the same owner and mode. The daemon signs with the new set after a SIGHUP
(`systemctl reload dispatcher`). Neither command prints a secret: only fingerprints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.config.signing_secret import (
    SigningSecret,
    format_secrets,
    new_secret,
    parse_secrets,
    rotated,
)

if TYPE_CHECKING:
    from dispatcher.config.settings import Settings

EXIT_FAILURE = 1
NEW_FILE_MODE = 0o600


def add_command(command: argparse.ArgumentParser) -> None:
    """The actions of `dispatcher signing-secret`."""
    actions = command.add_subparsers(dest="secret_action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", help="list the secrets in use (fingerprints and ends, never the secrets)"
    )
    rotate = actions.add_parser(
        "rotate",
        help="write a new primary secret; keep the old one for the overlap, then drop it",
        description="Write a new random primary at the top of the secret file, keep the old "
        "primary until now + the overlap, drop secrets whose overlap has ended. Then send "
        "the daemon SIGHUP (systemctl reload dispatcher) and give receivers the new secret "
        "(the file's first) before the overlap ends.",
    )
    for action in (listing, rotate):
        action.add_argument(
            "--file",
            type=Path,
            metavar="FILE",
            help="the secret file (default: http.signing_secret_file); rotate creates it "
            "when it does not exist",
        )
    rotate.add_argument(
        "--overlap-s",
        type=float,
        metavar="S",
        help="seconds the old primary keeps signing (default: http.signing_secret_overlap_s)",
    )


def cmd_signing_secret(settings: Settings, args: argparse.Namespace) -> int:
    path = args.file or settings.http.signing_secret_file
    if path is None:
        inline = settings.http.signing_secret is not None
        print(
            "dispatcher: no secret file: "
            + (
                "the secret is set inline (http.signing_secret); move it to a file named by "
                "http.signing_secret_file (DISPATCHER_HTTP__SIGNING_SECRET_FILE) to rotate it"
                if inline
                else "give --file FILE or set http.signing_secret_file"
            ),
            file=sys.stderr,
        )
        return EXIT_FAILURE
    now = datetime.now(UTC).replace(microsecond=0)
    if args.secret_action == "list":
        for entry in read(path):
            state = "" if entry.in_use(now) else " (ended: the next rotate drops it)"
            print(f"line {entry.line}: {entry.describe()}{state}")
        return 0
    overlap_s = settings.http.signing_secret_overlap_s if args.overlap_s is None else args.overlap_s
    if not 0 <= overlap_s <= 10 * 365 * 86400:
        print("dispatcher: --overlap-s must be from 0 to 315360000 seconds", file=sys.stderr)
        return EXIT_FAILURE
    current = read(path) if path.exists() else []
    entries = rotated(current, new_secret(), now, overlap_s)
    write(path, format_secrets(entries))
    dropped = len(current) + 1 - len(entries)
    print(f"rotated {path}: new primary {entries[0].fingerprint} (its first secret)")
    for entry in entries[1:]:
        print(f"  still signing: {entry.describe()}")
    if dropped:
        print(f"  dropped: {dropped} secret(s) whose overlap ended")
    print("send the daemon SIGHUP (systemctl reload dispatcher) to sign with the new set")
    return 0


def read(path: Path) -> list[SigningSecret]:
    """The file's secrets; one that cannot be used ends the command naming its line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SystemExit(f"dispatcher: cannot read {path}: {exc.strerror}") from None
    try:
        return parse_secrets(text, str(path))
    except ValueError as exc:
        raise SystemExit(f"dispatcher: {exc}; the file was not changed") from None


def write(path: Path, text: str) -> None:
    """Replace `path` with `text` at once (a reader sees the old file or the new one, never a
    part), keeping the old file's owner and mode (a new file: 0600, readable by its owner)."""
    try:
        old = path.stat()
    except FileNotFoundError:
        old = None
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise SystemExit(f"dispatcher: cannot write beside {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, old.st_mode & 0o7777 if old else NEW_FILE_MODE)
        if old is not None and hasattr(os, "chown"):
            # root rotating the daemon user's file: the daemon must still read it (not root:
            # the file is ours already)
            with contextlib.suppress(PermissionError):
                os.chown(temporary, old.st_uid, old.st_gid)
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise SystemExit(f"dispatcher: cannot write {path}: {exc.strerror}") from None
