"""Who owns the embedded PostgreSQL of a state directory: whoever holds its lock file.

The owner holds an exclusive `flock` on `<state_dir>/embedded-postgres.lock` for as long as it
lives and writes `<pid> <role>` into it. The kernel drops the lock when the process ends, however
it ends (a `kill -9` included), so a stale owner can never block the next one, and no list of
users has to be cleaned up. The file's text only says who holds the lock; the lock decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Role = Literal["daemon", "command"]
LOCK_NAME = "embedded-postgres.lock"
POLL_S = 0.05


@dataclass(frozen=True)
class Holder:
    """What the lock file says about the process holding it (best effort: read without the lock)."""

    pid: int | None
    role: str

    def describe(self) -> str:
        who = "dispatcher run" if self.role == "daemon" else "a dispatcher command"
        return f"{who} (pid {self.pid})" if self.pid else who


class OwnerLock:
    """The lock file of one state directory. `try_acquire` takes it if free; `release` (or the
    end of the process) gives it back. The descriptor is not inherited by child processes
    (Python opens files close-on-exec), so a server started by the owner never holds it."""

    def __init__(self, state_dir: Path):
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, role: Role) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {role}\n".encode(), 0)
        self._fd = fd
        return True

    def holder(self) -> Holder:
        try:
            words = self.path.read_text().split()
        except OSError:
            words = []
        pid = int(words[0]) if words and words[0].isdigit() else None
        return Holder(pid, words[1] if len(words) > 1 else "")

    def wait_until_free(self, role: Role, timeout_s: float) -> bool:
        """Take the lock once its holder lets go, within `timeout_s`; False if it never did."""
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire(role):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # nobody holds it: the next reader sees no stale pid
        os.close(fd)
