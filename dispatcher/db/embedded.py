"""The embedded PostgreSQL (pgserver) used when no database URL is configured."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in `<state_dir>/pgdata`; it persists across restarts.

    Started on `start()`, stopped on `stop()`. If the daemon dies hard, the server keeps running
    and the next start reuses it.
    """

    def __init__(self, state_dir: Path):
        self.data_dir = (state_dir / "pgdata").absolute()
        self._server: Any = None

    def start(self) -> str:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if "XDG_RUNTIME_DIR" not in os.environ:  # pgserver keeps its lock file there
            runtime = self.data_dir.parent / "run"
            runtime.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import pgserver  # imported late (and after XDG_RUNTIME_DIR): unused with an external URL

        self._server = pgserver.get_server(self.data_dir, cleanup_mode=None)
        uri: str = self._server.get_uri()
        log.info("using embedded PostgreSQL in %s", self.data_dir)
        return uri

    def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.cleanup_mode = "stop"
        server._cleanup()  # pgserver stops the server when the last handle in any process goes
        log.info("stopped embedded PostgreSQL")
