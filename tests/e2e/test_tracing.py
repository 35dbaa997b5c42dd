"""OpenTelemetry traces through a real daemon: the SDK's in-memory exporter records the spans of
an in-process daemon, a loopback target records the `traceparent` it receives.

A producer's trace context reaches the intake span, is stored with the job, parents every
attempt's span and travels on the HTTP push, so the target's trace is the producer's. An
invalid `traceparent` is ignored (W3C Trace Context) and never breaks intake. With tracing off
nothing is stored and no header is sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dispatcher.observability.logs import JsonFormatter
from dispatcher.observability.tracing import Tracing
from tests.harness import InProcessDaemon, Target, make_settings, running_daemon, serve_target
from tests.harness import wait_until as wait_for

PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
PRODUCER = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"
FAST_RETRY = {"default": {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "max_attempts": 5}}


def in_memory() -> tuple[Tracing, InMemorySpanExporter]:
    """A tracer provider of the test's own (never the global one): spans are exported as they
    end, so a test can wait for them."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def parts(traceparent: str) -> tuple[int, int]:
    """(trace id, parent id) of a traceparent header value."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


async def post(
    d: InProcessDaemon, key: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    async with d.session.post(
        f"{d.base_url}/v1/jobs", json=body, headers={"Idempotency-Key": key, **(headers or {})}
    ) as r:
        assert r.status == 202, await r.text()
        return await r.json()  # type: ignore[no-any-return]


async def stored_traceparent(db_url: str, job_id: int) -> str | None:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT traceparent FROM dispatcher.jobs WHERE id = $1", job_id
        )
    finally:
        await conn.close()


@contextmanager
def json_lines(logger: str) -> Iterator[list[dict[str, Any]]]:
    """The lines `logger` writes meanwhile, as the daemon's JSON log format renders them."""
    lines: list[dict[str, Any]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(self.format(record)))

    handler = Capture()
    handler.setFormatter(JsonFormatter())
    target = logging.getLogger(logger)
    level = target.level
    target.setLevel(logging.INFO)
    target.addHandler(handler)
    try:
        yield lines
    finally:
        target.removeHandler(handler)
        target.setLevel(level)


async def test_the_producers_trace_runs_through_intake_the_attempt_and_the_push(
    db_url: str,
) -> None:
    tracing, exporter = in_memory()
    async with (
        serve_target(Target()) as target,
        running_daemon(make_settings(db_url), tracing) as d,
    ):
        body = {"handler": "http", "target": {"url": target.url}, "payload": {}, "tenant": "t-7"}
        job = await post(d, "traced-1", body, {"traceparent": PRODUCER})
        await wait_for(lambda: spans(exporter, "dispatcher.attempt"), what="the attempt span")
        assert await stored_traceparent(db_url, job["id"]) == PRODUCER

    (intake,) = spans(exporter, "dispatcher.intake")
    assert intake.kind is SpanKind.PRODUCER
    assert intake.context.trace_id == int(PRODUCER_TRACE, 16)
    assert intake.parent is not None and intake.parent.span_id == int(PRODUCER_SPAN, 16)
    assert dict(intake.attributes or {}) == {
        "dispatcher.intake.items": 1,
        "dispatcher.intake.created": 1,
        "dispatcher.intake.outcome": "created",
        "dispatcher.job.id": job["id"],
        "dispatcher.job.key": "traced-1",
        "dispatcher.job.queue": "default",
        "dispatcher.job.tenant": "t-7",
    }

    (attempt,) = spans(exporter, "dispatcher.attempt")
    assert attempt.kind is SpanKind.CONSUMER
    assert attempt.context.trace_id == int(PRODUCER_TRACE, 16)
    assert attempt.parent is not None and attempt.parent.span_id == int(PRODUCER_SPAN, 16)
    assert attempt.parent.is_remote
    assert dict(attempt.attributes or {}) == {
        "dispatcher.job.id": job["id"],
        "dispatcher.job.key": "traced-1",
        "dispatcher.job.queue": "default",
        "dispatcher.job.tenant": "t-7",
        "dispatcher.job.handler": "http",
        "dispatcher.job.attempt": 1,
        "dispatcher.attempt.outcome": "succeeded",
    }
    assert attempt.status.status_code is StatusCode.UNSET

    # the target's trace joins the producer's, with the attempt span as its parent
    (request,) = target.requests
    sent = request["headers"]["traceparent"]
    assert parts(sent) == (int(PRODUCER_TRACE, 16), attempt.context.span_id)
    assert sent.endswith("-01")  # sampled, as the producer asked


async def test_a_batch_shares_its_requests_context_and_every_attempt_has_a_span(
    db_url: str,
) -> None:
    """One intake span for the batch; each item's attempts (a retry included) in the producer's
    trace, their log lines carrying its trace id."""
    tracing, exporter = in_memory()

    async def fail_once(request: web.Request, count: int) -> web.StreamResponse:
        if request.headers["Idempotency-Key"] == "batch-0" and count == 1:
            return web.Response(status=500, text="try again")
        return web.json_response({"ok": True})

    target = Target(respond=fail_once)
    settings = make_settings(db_url, queues=FAST_RETRY)
    with json_lines("dispatcher.job") as lines:
        async with serve_target(target), running_daemon(settings, tracing) as d:
            items = [
                {"idempotency_key": f"batch-{i}", "handler": "http", "target": {"url": target.url}}
                for i in range(2)
            ]
            items.append({"idempotency_key": "batch-bad", "handler": "http", "queue": "nope"})
            async with d.session.post(
                f"{d.base_url}/v1/jobs/batch",
                json={"jobs": items},
                headers={"traceparent": PRODUCER},
            ) as r:
                assert r.status == 200, await r.text()
                statuses = [item["status"] for item in (await r.json())["results"]]
            assert statuses == ["accepted", "accepted", "rejected"]
            await wait_for(
                lambda: len(spans(exporter, "dispatcher.attempt")) == 3, what="three attempts"
            )

    (intake,) = spans(exporter, "dispatcher.intake")
    assert intake.parent is not None and intake.parent.span_id == int(PRODUCER_SPAN, 16)
    assert dict(intake.attributes or {}) == {
        "dispatcher.intake.items": 3,
        "dispatcher.intake.created": 2,
        "dispatcher.intake.rejected": 1,
    }
    attempts = sorted(
        (a.attributes or {}).get("dispatcher.job.key", "")
        + f"#{(a.attributes or {}).get('dispatcher.job.attempt')}:"
        + f"{(a.attributes or {}).get('dispatcher.attempt.outcome')}"
        for a in spans(exporter, "dispatcher.attempt")
    )
    assert attempts == ["batch-0#1:retry", "batch-0#2:succeeded", "batch-1#1:succeeded"]
    for attempt in spans(exporter, "dispatcher.attempt"):
        assert attempt.context.trace_id == int(PRODUCER_TRACE, 16)
        assert attempt.parent is not None and attempt.parent.span_id == int(PRODUCER_SPAN, 16)
        failed = (attempt.attributes or {}).get("dispatcher.attempt.outcome") == "retry"
        assert (attempt.status.status_code is StatusCode.ERROR) == failed
    # every push carries its own attempt's span as the parent, in the producer's trace
    attempt_spans = {a.context.span_id for a in spans(exporter, "dispatcher.attempt")}
    pushed = [parts(r["headers"]["traceparent"]) for r in target.requests]
    assert {trace for trace, _ in pushed} == {int(PRODUCER_TRACE, 16)}
    assert {parent for _, parent in pushed} == attempt_spans
    # the retry's log line names the trace
    (retry_line,) = [line for line in lines if line["message"].startswith("retry in")]
    assert retry_line["trace_id"] == PRODUCER_TRACE
    assert retry_line["job_key"] == "batch-0"


BAD_TRACEPARENTS = {
    "garbage": "not a traceparent",
    "uppercase hex": PRODUCER.upper(),
    "version ff": f"ff-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01",
    "version 00 with a fifth field": f"{PRODUCER}-extra",
    "zero trace id": f"00-{'0' * 32}-{PRODUCER_SPAN}-01",
    "zero parent id": f"00-{PRODUCER_TRACE}-{'0' * 16}-01",
    "short trace id": f"00-{PRODUCER_TRACE[:-1]}-{PRODUCER_SPAN}-01",
    "empty": "",
}


async def test_an_invalid_traceparent_is_ignored_and_never_breaks_intake(db_url: str) -> None:
    """Each bad value: 202, and the job is traced in a trace of its own (the intake span's)
    instead of joining anything derived from the bad value. Two valid headers count as invalid
    too; a later version is read by its first four fields and stored as version 00."""
    tracing, exporter = in_memory()
    later = {"due_at": "2099-01-01T00:00:00Z"}  # stored, never attempted
    body = {"handler": "http", "target": {"url": "http://127.0.0.1:9/hook"}, "payload": {}, **later}
    async with running_daemon(make_settings(db_url), tracing) as d:
        stored = {}  # by job key
        for name, value in BAD_TRACEPARENTS.items():
            job = await post(d, f"bad {name}", body, {"traceparent": value})
            stored[job["key"]] = await stored_traceparent(db_url, job["id"])
        async with d.session.post(
            f"{d.base_url}/v1/jobs",
            json=body,
            headers=[
                ("Idempotency-Key", "bad two headers"),
                ("traceparent", PRODUCER),
                ("traceparent", PRODUCER),
            ],
        ) as r:
            assert r.status == 202, await r.text()
            stored["bad two headers"] = await stored_traceparent(db_url, (await r.json())["id"])
        job = await post(
            d, "later-version", body, {"traceparent": f"01-{PRODUCER_TRACE}-{PRODUCER_SPAN}-03-x"}
        )
        assert await stored_traceparent(db_url, job["id"]) == PRODUCER  # version 00, flag 01

    intake_by_key = {
        (s.attributes or {}).get("dispatcher.job.key"): s
        for s in spans(exporter, "dispatcher.intake")
    }
    assert len(stored) == len(BAD_TRACEPARENTS) + 1
    for name, traceparent in stored.items():
        span = intake_by_key[name]
        assert span.parent is None, name  # nothing of the bad value was used
        assert traceparent is not None, name
        assert parts(traceparent) == (span.context.trace_id, span.context.span_id), name
        assert span.context.trace_id != int(PRODUCER_TRACE, 16), name


async def test_with_tracing_off_nothing_is_stored_and_no_header_is_sent(db_url: str) -> None:
    _, exporter = in_memory()  # made, but not given to the daemon
    async with serve_target(Target()) as target, running_daemon(make_settings(db_url)) as d:
        body = {"handler": "http", "target": {"url": target.url}, "payload": {}}
        job = await post(d, "untraced", body, {"traceparent": PRODUCER})
        await wait_for(lambda: len(target.requests) == 1, what="the push")
        assert await stored_traceparent(db_url, job["id"]) is None
        assert d.daemon.tracing is None
    assert "traceparent" not in {name.lower() for name in target.requests[0]["headers"]}
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("traced", [False, True], ids=["off", "on"])
async def test_a_targets_own_traceparent_header_is_sent_only_while_tracing_is_off(
    db_url: str, traced: bool
) -> None:
    """A static `traceparent` in target.headers passes through untraced; with tracing on the
    attempt's own context replaces it (one header, never two)."""
    static = f"00-{'1' * 32}-{'2' * 16}-01"
    tracing, _ = in_memory()
    received: list[list[str]] = []

    async def record(request: web.Request, count: int) -> web.StreamResponse:
        received.append(request.headers.getall("traceparent", []))
        return web.json_response({"ok": True})

    target = Target(respond=record)
    async with (
        serve_target(target),
        running_daemon(make_settings(db_url), tracing if traced else None) as d,
    ):
        hook = {"url": target.url, "headers": {"traceparent": static}}
        await post(d, "own", {"handler": "http", "target": hook, "payload": {}})
        await wait_for(lambda: len(received) == 1, what="the push")
    ((value,),) = received  # one push, one header
    assert (value == static) is not traced
