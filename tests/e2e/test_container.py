"""The container image, built and run with podman: it serves with the embedded database in a
volume, its HEALTHCHECK passes, `podman stop` drains an attempt in flight and exits 0 within the
grace period, a restart finds the jobs, and it runs as a non-root user on a read-only root
filesystem with every capability dropped.

No image registry is reachable on this kind of machine, so the base is a Debian 12 image made by
`.ci/podman.sh` (which also installs podman when it is missing); set DISPATCHER_CONTAINER_BASE
(e.g. `python:3.11-slim`) to build on a registry's image instead. Skipped only where podman
cannot be installed (not root, no apt-get); under CI (`CI` set) that is a failure instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dispatcher.config.settings import Settings
from tests.harness import Target, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / ".ci" / "podman.sh"
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / ".ci" / "containers.conf")}
# The host's CA bundle, for pip inside the build where TLS to the package index is intercepted.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOKEN = "container-test-token-0123456789abcdef"
# What the examples give a supervisor: the daemon's whole stop budget and a margin.
GRACE_S = int(Settings().stop_budget_s()) + 15
# The dispatcher's own layers (a venv with its dependencies and the embedded PostgreSQL): the
# bound catches a build context, a pip cache or a compiler landing in the image.
OWN_LAYERS_MAX_BYTES = 200 * 1024 * 1024

# a first run installs podman and makes the base image; runs when asked (--with container)
pytestmark = [pytest.mark.timeout(1200), pytest.mark.container]


def podman_sync(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout_s
    )


async def podman(*args: str, check: bool = True, timeout_s: float = 120) -> str:
    """Run podman without blocking the loop (the test's target answers on it meanwhile)."""
    proc = await asyncio.create_subprocess_exec(
        "podman", *args, env=ENV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {err.decode()}")
    return out.decode() + (err.decode() if not check else "")


@pytest.fixture(scope="module")
def base_image() -> str:
    """Podman installed and a base image present; skip only where that cannot be done."""
    chosen = os.environ.get("DISPATCHER_CONTAINER_BASE")
    argv = ["bash", str(INSTALL), *(["--no-base"] if chosen else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode == 3:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the container test: {done.stderr.strip()}")
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, f"{INSTALL} failed: {done.stderr[-3000:]}"
    return chosen or done.stdout.strip()


def image_size(tag: str) -> int:
    done = podman_sync("image", "inspect", "--format", "{{.Size}}", tag)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def code_layers(build_output: str) -> list[str]:
    """The images a build made from the code itself: every step from the copy of the sources on
    (the build stage's last steps and the whole final stage), newest first. The layers before,
    the dependencies' install above all, are the cache worth keeping for the next build."""
    found: list[str] = []
    from_code = False
    for line in build_output.splitlines():
        from_code = from_code or "COPY pyproject.toml README.md" in line
        step = re.fullmatch(r"--> (?:Using cache )?([0-9a-f]{11,64})", line.strip())
        if from_code and step:
            found.append(step.group(1))
    return found[::-1]


@pytest.fixture(scope="module")
def image(base_image: str) -> Iterator[str]:
    """The Dockerfile built on that base; the dependencies' layers stay cached for the next
    build, the layers made from this code are removed (each change of the code would otherwise
    leave about 200 MB behind)."""
    tag = f"localhost/dispatcher-test:{os.getpid()}"
    argv = ["build", "--format", "docker", "--network", "host", "--build-arg", f"BASE={base_image}"]
    if CA_BUNDLE.is_file():
        argv += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "--build-arg", f"PIP_CERT={CA_BUNDLE}"]
    started = time.monotonic()
    done = podman_sync(*argv, "-t", tag, str(ROOT), timeout_s=900)
    assert done.returncode == 0, f"build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    size, base = image_size(tag), image_size(base_image)
    print(
        f"\nbuilt {tag} on {base_image} in {time.monotonic() - started:.0f} s: "
        f"{size / 1e6:.0f} MB ({(size - base) / 1e6:.0f} MB over the base)"
    )
    assert size - base < OWN_LAYERS_MAX_BYTES
    try:
        yield tag
    finally:
        podman_sync("rmi", "--force", tag)
        for layer in code_layers(done.stdout):
            # one by one, children first; --no-prune keeps their parents, the cache above all
            podman_sync("rmi", "--ignore", "--no-prune", layer)


async def bridge_gateway() -> str:
    """The host's address on podman's default network, where a container reaches the host."""
    (network,) = json.loads(await podman("network", "inspect", "podman"))
    gateways = [s["gateway"] for s in network["subnets"] if "." in s["gateway"]]
    assert gateways, network
    return str(gateways[0])


async def serve_on(target: Target, host: str) -> web.AppRunner:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", target._handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, host, port).start()
    target.url = f"http://{host}:{port}/hook"
    return runner


class Container:
    """One container of the image with its state volume, reached through a published port."""

    def __init__(self, image: str):
        self.image = image
        self.name = f"dispatcher-test-{uuid.uuid4().hex[:10]}"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    async def run(self, env: dict[str, str]) -> None:
        await podman("volume", "create", self.name)
        flags = [
            "--init",  # reaps the embedded PostgreSQL's processes
            "--read-only",
            "--read-only-tmpfs=false",  # as Docker's --read-only: no writable /tmp or /run either
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
        ]
        pairs = [f"{k}={v}" for k, v in env.items()]
        await podman(
            "run", "--detach", "--name", self.name, *flags,
            "--publish", f"127.0.0.1:{self.port}:8080",
            "--volume", f"{self.name}:/var/lib/dispatcher",
            *[arg for pair in pairs for arg in ("--env", pair)],
            self.image,
        )  # fmt: skip

    async def inspect(self, template: str) -> str:
        return (await podman("inspect", "--format", template, self.name)).strip()

    async def logs(self) -> str:
        return await podman("logs", self.name, check=False)

    async def ready(self) -> bool:
        if await self.inspect("{{.State.Running}}") != "true":
            raise AssertionError(f"the container exited:\n{(await self.logs())[-4000:]}")
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{self.base_url}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def wait_ready(self) -> None:
        await wait_until(self.ready, timeout_s=90, interval_s=0.2, what="container ready")

    async def call(self, method: str, path: str, expect: int, **kwargs: Any) -> dict[str, Any]:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        url = f"{self.base_url}{path}"
        async with (
            aiohttp.ClientSession() as s,
            s.request(method, url, headers=headers, **kwargs) as r,
        ):
            assert r.status == expect, await r.text()
            answer: dict[str, Any] = await r.json()
            return answer

    async def post_job(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", "/v1/jobs", 202, json=body, headers={"Idempotency-Key": key})

    async def get_job(self, job_id: int) -> dict[str, Any]:
        return await self.call("GET", f"/v1/jobs/{job_id}", 200)

    async def remove(self) -> None:
        await podman("rm", "--force", "--time", "0", self.name, check=False)
        await podman("volume", "rm", "--force", self.name, check=False)


@pytest.fixture
async def container(image: str) -> AsyncIterator[Container]:
    box = Container(image)
    try:
        yield box
    finally:
        await box.remove()


async def test_image_serves_drains_on_podman_stop_and_keeps_its_jobs(
    container: Container,
) -> None:
    release = asyncio.Event()

    async def held_until_released(request: web.Request, count: int) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"ok": True})

    await container.run(
        {
            "DISPATCHER_API_TOKENS": TOKEN,
            # the published port is on the host's loopback; this is the image's 0.0.0.0:8080
            "DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS": "true",
            "DISPATCHER_TARGET_ALLOW_HTTP": "true",
            "DISPATCHER_TARGET_ALLOW_CIDRS": f"{await bridge_gateway()}/32",
        }
    )
    await container.wait_ready()
    # The bridge exists while a container uses it, so the target binds only now.
    target = Target(respond=held_until_released)
    runner = await serve_on(target, await bridge_gateway())
    try:
        # HEALTHCHECK: the image declares it (docker format) and it passes on a ready daemon.
        test = json.loads(await container.inspect("{{json .Config.Healthcheck.Test}}"))
        assert test == ["CMD", "python3", "-m", "dispatcher.healthcheck"]
        await podman("healthcheck", "run", container.name)
        assert await container.inspect("{{.State.Health.Status}}") == "healthy"

        # Unprivileged: every process (init, daemon, PostgreSQL) runs as the image's user.
        users = (await podman("top", container.name, "huser")).split()[1:]
        assert users and set(users) == {"10001"}, users
        # Read-only: not even root inside the container can write outside the volume.
        refused = await podman(
            "exec", "--user", "0", container.name, "touch", "/probe", check=False
        )
        assert "Read-only file system" in refused, refused
        # The tracing extra is in the image: OTEL_* variables alone turn traces on there.
        await podman(
            "exec",
            container.name,
            "python3",
            "-c",
            "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter",
        )

        later = await container.post_job(
            "container-later",
            {"handler": "http", "target": {"url": target.url}, "due_at": "2099-01-01T00:00:00Z"},
        )
        now = await container.post_job(
            "container-now", {"handler": "http", "target": {"url": target.url}, "payload": {}}
        )
        await wait_until(lambda: len(target.requests) == 1, timeout_s=30, what="attempt started")

        # `podman stop` sends the image's STOPSIGNAL; the attempt in flight holds the drain
        # until the target answers, then the daemon exits 0 before the grace period's SIGKILL.
        started = time.monotonic()
        stop = asyncio.create_task(
            podman("stop", "--time", str(GRACE_S), container.name, timeout_s=GRACE_S + 30)
        )

        async def draining() -> bool:
            return "draining" in await container.logs()

        await wait_until(draining, timeout_s=30, interval_s=0.2, what="drain started")
        release.set()
        await stop
        print(f"\npodman stop with an attempt in flight: {time.monotonic() - started:.1f} s")
        assert await container.inspect("{{.State.ExitCode}}") == "0", await container.logs()
        assert "dispatcher stopped" in await container.logs()
    finally:
        release.set()
        await runner.cleanup()

    await podman("start", container.name)
    await container.wait_ready()
    finished = await container.get_job(now["id"])
    assert finished["state"] == "succeeded", finished
    assert finished["attempt"] == 1, finished
    assert target.request_keys() == ["container-now"]
    kept = await container.get_job(later["id"])
    assert (kept["key"], kept["state"]) == ("container-later", "scheduled"), kept
