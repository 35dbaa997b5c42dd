"""The image's health check probes where the daemon really listens: the metrics listener when
there is one, else the API listener (HTTPS when TLS is on), wildcard addresses on loopback."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme

from dispatcher.config.settings import Settings
from dispatcher.healthcheck import healthz_url, probe
from tests.harness import free_port


def settings(**raw: Any) -> Settings:
    base: dict[str, Any] = {"api_tokens": ["t" * 32], "allow_plain_http_tokens": True}
    return Settings.model_validate({**base, **raw})


@pytest.mark.parametrize(
    ("raw", "url"),
    [
        ({"listen": "0.0.0.0:8080"}, "http://127.0.0.1:8080/healthz"),
        ({"listen": "[::]:8080"}, "http://[::1]:8080/healthz"),
        ({"listen": "10.1.2.3:8080"}, "http://10.1.2.3:8080/healthz"),
        (
            {"listen": "127.0.0.1:8080", "metrics_listen": "0.0.0.0:9090"},
            "http://127.0.0.1:9090/healthz",
        ),
    ],
)
def test_url_follows_the_listeners(raw: dict[str, Any], url: str) -> None:
    assert healthz_url(settings(**raw)) == url


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("dispatcher.example.org")  # not the loopback address probed
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    return ca, cert_file, key_file


def test_tls_makes_it_https_unless_a_metrics_listener_serves_it(
    tls_files: tuple[trustme.CA, Path, Path],
) -> None:
    _, cert_file, key_file = tls_files
    tls = {"cert_file": str(cert_file), "key_file": str(key_file)}
    assert healthz_url(settings(listen="0.0.0.0:8443", tls=tls)) == (
        "https://127.0.0.1:8443/healthz"
    )
    with_metrics = settings(listen="0.0.0.0:8443", metrics_listen="0.0.0.0:9090", tls=tls)
    assert healthz_url(with_metrics) == "http://127.0.0.1:9090/healthz"


class Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tls_files: tuple[trustme.CA, Path, Path]) -> Iterator[int]:
    _, cert_file, key_file = tls_files
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_probe_over_tls_to_its_own_listener(https_server: int) -> None:
    assert probe(f"https://127.0.0.1:{https_server}/healthz") is None
    problem = probe(f"https://127.0.0.1:{https_server}/elsewhere")
    assert problem is not None and "HTTP 404" in problem


def test_probe_names_a_listener_that_does_not_answer() -> None:
    url = f"http://127.0.0.1:{free_port()}/healthz"
    problem = probe(url)
    assert problem is not None and url in problem
