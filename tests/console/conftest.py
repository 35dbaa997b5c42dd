"""The console tests' browser: one Chromium per test, signed in by the test itself, on the
module's own `daemon` fixture (each module starts the daemon its pages need)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console.browser import Browser


@pytest.fixture
def browser(daemon: Any, tmp_path: Path) -> Iterator[Browser]:
    """`daemon`: any handle with a `base_url` (a daemon process or one in this process)."""
    b = Browser(daemon.base_url, tmp_path / "profile", tmp_path / "screenshots")
    try:
        yield b
    finally:
        b.close()
