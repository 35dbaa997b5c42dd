"""Tracing turned on the standard way: `dispatcher run` as a child process with
`OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a loopback collector, which receives the spans over
OTLP/HTTP (protobuf) and decodes them. A bad `OTEL_*` value stops the daemon before anything
starts, with one line naming the variable."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.harness import LOOPBACK_ENV, Target, free_port, serve_target
from tests.harness.fixtures import Spawn

PRODUCER_TRACE = "0af7651916cd43dd8448eb211c80319c"
PRODUCER = f"00-{PRODUCER_TRACE}-b7ad6b7169203331-01"
ENV = {
    **LOOPBACK_ENV,
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_BASE_S": "0.05",
    "DISPATCHER_QUEUES__DEFAULT__BACKOFF_CAP_S": "0.1",
    "OTEL_SERVICE_NAME": "dispatcher-under-test",
    "OTEL_BSP_SCHEDULE_DELAY": "50",  # export every 50 ms, not every 5 s
}


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver: every span it was sent, with its resource's service name."""

    url: str = ""
    spans: list[dict[str, Any]] = field(default_factory=list)

    async def receive(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}.get(
                "service.name"
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: a.value for a in span.attributes}
                    self.spans.append(
                        {
                            "name": span.name,
                            "service": service,
                            "trace_id": span.trace_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "key": attributes["dispatcher.job.key"].string_value
                            if "dispatcher.job.key" in attributes
                            else None,
                            "outcome": attributes["dispatcher.attempt.outcome"].string_value
                            if "dispatcher.attempt.outcome" in attributes
                            else None,
                        }
                    )
        return web.Response(content_type="application/x-protobuf", body=b"")

    def named(self, name: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name]


@asynccontextmanager
async def collector() -> AsyncIterator[Collector]:
    found = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", found.receive)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    found.url = f"http://127.0.0.1:{port}"
    try:
        yield found
    finally:
        await runner.cleanup()


async def test_spans_reach_an_otlp_collector_named_by_the_standard_variables(
    db_url: str, spawn: Spawn
) -> None:
    async def fail_once(request: web.Request, count: int) -> web.StreamResponse:
        return web.Response(status=503 if count == 1 else 200)

    target = Target(respond=fail_once)
    async with collector() as otlp, serve_target(target):
        daemon = await spawn(
            {"DISPATCHER_DATABASE_URL": db_url, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, **ENV}
        )
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{daemon.base_url}/v1/jobs",
                    json={"handler": "http", "target": {"url": target.url}, "payload": {}},
                    headers={"Idempotency-Key": "otlp-1", "traceparent": PRODUCER},
                ) as r,
            ):
                assert r.status == 202, await r.text()
            await target.wait_for(lambda t: len(t.requests) == 2, what="a retried push")
        finally:
            assert await daemon.stop() == 0, daemon.log_text()[-3000:]
        # the last span is exported at the latest by the drain's flush
        assert [s["outcome"] for s in otlp.named("dispatcher.attempt")] == ["retry", "succeeded"]

    (intake,) = otlp.named("dispatcher.intake")
    assert (intake["key"], intake["trace_id"]) == ("otlp-1", PRODUCER_TRACE)
    assert {s["trace_id"] for s in otlp.spans} == {PRODUCER_TRACE}
    assert {s["service"] for s in otlp.spans} == {"dispatcher-under-test"}
    for request in target.requests:
        assert request["headers"]["traceparent"].split("-")[1] == PRODUCER_TRACE
    lines = [json.loads(line) for line in daemon.log_text().splitlines() if line.startswith("{")]
    assert any("tracing on: spans go to OTLP over HTTP to" in line["message"] for line in lines)
    (retry,) = [line for line in lines if line["message"].startswith("retry in")]
    assert retry["trace_id"] == PRODUCER_TRACE


async def test_a_bad_otel_setting_stops_the_daemon_with_one_line(db_url: str, spawn: Spawn) -> None:
    for variable, value in (
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ):
        daemon = await spawn(
            {
                "DISPATCHER_DATABASE_URL": db_url,
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                variable: value,
            },
            wait_ready=False,
        )
        assert await daemon.wait() == 2
        (line,) = daemon.log_text().strip().splitlines()
        assert line.startswith(f"dispatcher: configuration error: {variable}: "), line
        assert value in line, line
