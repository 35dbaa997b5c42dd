"""dispatcher.client imports no driver and no web framework until one is used, so an application
needs only the extra of the door it uses (docs/client.md). A fresh interpreter shows it."""

from __future__ import annotations

import subprocess
import sys

OPTIONAL = ("psycopg", "sqlalchemy", "fastapi", "starlette", "flask", "aiohttp", "asyncpg")


def test_importing_the_client_loads_no_driver_or_framework() -> None:
    probe = (
        "import sys, dispatcher.client, dispatcher.client.webhooks; "
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
