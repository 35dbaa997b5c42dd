"""TLS on the API listener: HTTPS with TLS 1.2+, the bearer token over it, plain HTTP and old
protocol versions refused, and a renewed certificate picked up on SIGHUP by a real daemon
process without the listener going away."""

from __future__ import annotations

import asyncio
import signal
import ssl
from pathlib import Path

import aiohttp
import pytest
import trustme

from tests.harness import DaemonProcess, wait_until
from tests.harness.fixtures import Spawn

TOKEN = "tls-test-token-0123456789"


def write_cert(ca: trustme.CA, directory: Path) -> tuple[Path, Path, bytes]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = directory / "server.pem", directory / "server.key"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    return cert_file, key_file, cert.cert_chain_pems[0].bytes()


async def served_certificate(port: int, ca: trustme.CA) -> bytes:
    """The PEM of the certificate a fresh handshake gets."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return ssl.DER_cert_to_PEM_cert(der).encode()


def same_certificate(a: bytes, b: bytes) -> bool:
    return ssl.PEM_cert_to_DER_cert(a.decode()) == ssl.PEM_cert_to_DER_cert(b.decode())


@pytest.fixture
async def tls_daemon(
    db_url: str, tmp_path: Path, spawn: Spawn
) -> tuple[DaemonProcess, trustme.CA, Path]:
    ca = trustme.CA()
    cert_file, key_file, _ = write_cert(ca, tmp_path)
    env = {
        "DISPATCHER_DATABASE_URL": db_url,
        "DISPATCHER_TLS__CERT_FILE": str(cert_file),
        "DISPATCHER_TLS__KEY_FILE": str(key_file),
        "DISPATCHER_API_TOKENS": TOKEN,
    }
    daemon = await spawn(env, wait_ready=False)
    daemon.base_url = daemon.base_url.replace("http://", "https://")
    context = ssl.create_default_context()
    ca.configure_trust(context)

    async def ready() -> bool:
        assert daemon.proc is not None
        if daemon.proc.returncode is not None:
            raise AssertionError(daemon.log_text()[-3000:])
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"{daemon.base_url}/readyz", ssl=context) as r,
            ):
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, timeout_s=60, what="the TLS daemon ready")
    yield daemon, ca, tmp_path
    await daemon.stop()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_https_serves_the_api_and_refuses_plain_http_and_old_tls(
    tls_daemon: tuple[DaemonProcess, trustme.CA, Path],
) -> None:
    daemon, ca, _ = tls_daemon
    context = ssl.create_default_context()
    ca.configure_trust(context)
    headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "over-tls"}
    body = {"handler": "http", "target": {"url": "https://example.com/hook"}}
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{daemon.base_url}/v1/jobs", json=body, headers=headers, ssl=context
        ) as r:
            assert r.status == 202, await r.text()
        with pytest.raises(aiohttp.ClientError):
            plain = daemon.base_url.replace("https://", "http://")
            async with s.get(f"{plain}/healthz") as r:
                await r.read()
    old = ssl.create_default_context()
    ca.configure_trust(old)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, OSError)):
        _, writer = await asyncio.open_connection("127.0.0.1", daemon.port, ssl=old)
        writer.close()


async def test_sighup_reloads_a_renewed_certificate_without_dropping_the_listener(
    tls_daemon: tuple[DaemonProcess, trustme.CA, Path],
) -> None:
    daemon, ca, directory = tls_daemon
    first = await served_certificate(daemon.port, ca)
    _, _, renewed = write_cert(ca, directory)  # the same files, a new certificate
    assert not same_certificate(first, renewed)
    # a connection open across the reload keeps working
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{daemon.base_url}/healthz", ssl=context) as r:
            assert r.status == 200
        daemon.signal(signal.SIGHUP)
        await daemon.log.wait_for("TLS certificate reloaded", timeout_s=10)
        assert same_certificate(await served_certificate(daemon.port, ca), renewed)
        async with s.get(f"{daemon.base_url}/healthz", ssl=context) as r:
            assert r.status == 200

    # a broken renewal is refused and the current certificate stays
    (directory / "server.key").write_text("not a key")
    daemon.signal(signal.SIGHUP)
    await daemon.log.wait_for("TLS reload failed", timeout_s=10)
    assert same_certificate(await served_certificate(daemon.port, ca), renewed)
    assert daemon.proc is not None and daemon.proc.returncode is None
