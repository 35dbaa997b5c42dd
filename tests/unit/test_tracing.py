"""Tracing's pure parts: reading a W3C `traceparent`, deciding from the standard `OTEL_*`
variables whether to trace and where to, and the trace id on log lines."""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from dispatcher.errors import ConfigError
from dispatcher.observability import logs, tracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (f"00-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-01"),
        (f"00-{TRACE}-{SPAN}-00", f"00-{TRACE}-{SPAN}-00"),
        (f" \t00-{TRACE}-{SPAN}-01\t ", f"00-{TRACE}-{SPAN}-01"),  # optional whitespace
        (f"00-{TRACE}-{SPAN}-ff", f"00-{TRACE}-{SPAN}-01"),  # unknown flags dropped
        # a later version: its first four fields, sent on as version 00
        (f"01-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-01"),
        (f"cc-{TRACE}-{SPAN}-00-what-comes-next", f"00-{TRACE}-{SPAN}-00"),
        # invalid: ignored
        (None, None),
        ("", None),
        ("garbage", None),
        (f"00-{TRACE.upper()}-{SPAN}-01", None),
        (f"ff-{TRACE}-{SPAN}-01", None),
        (f"00-{TRACE}-{SPAN}-01-extra", None),
        (f"01-{TRACE}-{SPAN}-01extra", None),
        (f"00-{'0' * 32}-{SPAN}-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE[1:]}-{SPAN}-01", None),
        (f"00-{TRACE}-{SPAN}-1", None),
        (f"00_{TRACE}_{SPAN}_01", None),
        (f"00-{TRACE}-{SPAN}-01\n", None),
    ],
)
def test_a_traceparent_is_read_by_the_w3c_rules(value: str | None, stored: str | None) -> None:
    assert tracing.parse_traceparent(value) == stored


@pytest.fixture
def built() -> Iterator[list[tracing.Tracing]]:
    """Tracing objects a test built: their exporters are shut down afterwards."""
    made: list[tracing.Tracing] = []
    yield made
    for t in made:
        t.close()


def build(made: list[tracing.Tracing], env: dict[str, str]) -> tracing.Tracing | None:
    result = tracing.from_environment(env)
    if result is not None:
        made.append(result)
    return result


def test_tracing_is_off_unless_the_environment_asks(built: list[tracing.Tracing]) -> None:
    assert build(built, {}) is None
    assert build(built, {"OTEL_EXPORTER_OTLP_HEADERS": "a=b"}) is None  # no endpoint, no exporter
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert build(built, {**endpoint, "OTEL_SDK_DISABLED": "true"}) is None
    assert build(built, {**endpoint, "OTEL_TRACES_EXPORTER": "none"}) is None


@pytest.mark.parametrize(
    ("env", "about"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
            "OTLP over HTTP to http://collector:4318/v1/traces",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/custom"},
            "OTLP over HTTP to http://collector:4318/custom",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "OTLP over HTTP to http://localhost:4318/v1/traces"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "standard output"),
    ],
)
def test_the_exporter_and_its_endpoint_follow_the_otlp_specification(
    built: list[tracing.Tracing], env: dict[str, str], about: str
) -> None:
    made = build(built, env)
    assert made is not None
    assert made.about == about


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: unknown exporter 'zipkin'"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "xml"},
            "OTEL_EXPORTER_OTLP_PROTOCOL: 'xml' is not supported",
        ),
    ],
)
def test_a_bad_otel_setting_is_a_configuration_error_naming_it(
    built: list[tracing.Tracing], env: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        build(built, env)


@pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None,
    reason="the gRPC exporter is installed here",
)
def test_grpc_without_its_exporter_names_the_package(built: list[tracing.Tracing]) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(ConfigError, match="opentelemetry-exporter-otlp-proto-grpc"):
        build(built, env)


def test_log_lines_carry_the_trace_id_of_the_current_span_only_while_tracing_is_on() -> None:
    formatter = logs.JsonFormatter()
    tracer = TracerProvider().get_tracer("test")

    def line() -> dict[str, object]:
        record = logging.LogRecord("dispatcher.job", logging.INFO, __file__, 1, "hi", None, None)
        return json.loads(formatter.format(record))  # type: ignore[no-any-return]

    with tracer.start_as_current_span("work") as span:
        trace_id = f"{span.get_span_context().trace_id:032x}"
        assert "trace_id" not in line()  # off: no lookup at all
        logs.with_trace_ids(tracing.current_trace_id)
        try:
            assert line()["trace_id"] == trace_id
        finally:
            logs.with_trace_ids(None)
    logs.with_trace_ids(tracing.current_trace_id)
    try:
        assert "trace_id" not in line()  # on, but outside any span
    finally:
        logs.with_trace_ids(None)
