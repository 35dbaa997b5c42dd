"""OpenTelemetry traces: a span per intake request and per attempt, W3C trace context in and out.

Off unless the standard environment asks for an exporter (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_TRACES_EXPORTER`), or a tracer provider was
installed globally before the daemon started (`opentelemetry-instrument`). When off there is no
`Tracing` object at all: the components that could trace hold None and test it once per job, so
the hot paths create no span objects and enter no context managers.

The trace context a job was accepted in is stored with the job as a W3C `traceparent` string:
the producer's (the `traceparent` header of the intake request) when it sent a valid one, else
the intake span's own. Each attempt's span is that context's child, and the `http` effect sends
the attempt span's context as `traceparent`, so the target's spans join the producer's trace.
An invalid `traceparent` is ignored, as the W3C Trace Context recommendation asks: the request
is accepted and traced as if it had sent none.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from dispatcher import __version__
from dispatcher.errors import ConfigError
from dispatcher.model import EnqueueResult, Rejected

if TYPE_CHECKING:
    from dispatcher.model import Job

TRACEPARENT = "traceparent"
# version-traceid-parentid-flags; later versions may append fields after one more '-'
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\Z")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# The trace flag this implementation knows (W3C Trace Context level 1: sampled).
_SAMPLED = 0x01

# Span attributes (README: Tracing).
JOB_ID = "dispatcher.job.id"
JOB_KEY = "dispatcher.job.key"
JOB_QUEUE = "dispatcher.job.queue"
JOB_TENANT = "dispatcher.job.tenant"
JOB_HANDLER = "dispatcher.job.handler"
JOB_ATTEMPT = "dispatcher.job.attempt"
ATTEMPT_OUTCOME = "dispatcher.attempt.outcome"
INTAKE_ITEMS = "dispatcher.intake.items"
INTAKE_OUTCOME = "dispatcher.intake.outcome"
# Attempt outcomes that are not failures of the attempt itself.
_FINE = frozenset({"succeeded", "lease_lost", "interrupted"})

# The exporters `OTEL_TRACES_EXPORTER` may name here.
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")


def parse_traceparent(value: str | None) -> str | None:
    """The valid `traceparent` in `value`, normalized to version 00, or None.

    Rules of the W3C recommendation: lowercase hex; version ff is invalid; version 00 has
    exactly four fields; a later version is read by its first four fields (then '-' or the end);
    an all-zero trace id or parent id is invalid. Only the sampled flag is kept (the only flag
    version 00 defines), so a stored value is always one a version-00 peer accepts."""
    if value is None:
        return None
    match = _TRACEPARENT.match(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return f"00-{trace_id}-{span_id}-{int(flags, 16) & _SAMPLED:02x}"


def format_traceparent(span_context: SpanContext) -> str | None:
    """A span context as a version-00 `traceparent`, or None for an invalid context."""
    if not span_context.is_valid:
        return None
    flags = span_context.trace_flags & _SAMPLED
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


def context_of(traceparent: str | None) -> context.Context | None:
    """The context whose current span is the remote parent named by a stored `traceparent`
    (None: the new span starts a trace of its own)."""
    if not traceparent:
        return None
    _, trace_id, span_id, flags = traceparent.split("-")
    parent = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def current_traceparent() -> str | None:
    """The `traceparent` of the current span (the attempt's, inside `Tracing.attempt`)."""
    return format_traceparent(trace.get_current_span().get_span_context())


def current_trace_id() -> str | None:
    """The current span's trace id in hex, for log lines; None outside any span."""
    span_context = trace.get_current_span().get_span_context()
    return f"{span_context.trace_id:032x}" if span_context.is_valid else None


class Tracing:
    """Spans of one daemon, made by one tracer provider. `close()` flushes and shuts down the
    provider only when this object built it (from the environment); a provider handed in (a
    test's, or one installed globally by instrumentation) belongs to whoever made it."""

    def __init__(self, provider: trace.TracerProvider, *, owned: bool = False, about: str = ""):
        self._provider = provider
        self._owned = owned
        self.about = about  # what the start-up log line says about where spans go
        self._tracer = provider.get_tracer("dispatcher", __version__)

    # intake --------------------------------------------------------------------------------
    @contextmanager
    def intake(self, traceparent: str | None, items: int) -> Iterator[tuple[Span, str | None]]:
        """The span of one intake request (single or batch) and the `traceparent` its jobs
        store: the producer's when valid, else this span's own."""
        producer = parse_traceparent(traceparent)
        with self._tracer.start_as_current_span(
            "dispatcher.intake",
            context=context_of(producer),
            kind=SpanKind.PRODUCER,
            attributes={INTAKE_ITEMS: items},
        ) as span:
            yield span, producer or format_traceparent(span.get_span_context())

    @staticmethod
    def describe_intake(
        span: Span,
        items: Sequence[Any],
        results: Sequence[EnqueueResult | Rejected],
    ) -> None:
        """Outcome counts on the intake span; for a single item, the job's own attributes."""
        if not span.is_recording():
            return
        outcomes = [r.outcome if isinstance(r, EnqueueResult) else "rejected" for r in results]
        for outcome in set(outcomes):
            span.set_attribute(f"dispatcher.intake.{outcome}", outcomes.count(outcome))
        if len(results) == 1:
            result = results[0]
            span.set_attribute(INTAKE_OUTCOME, outcomes[0])
            if isinstance(result, EnqueueResult):
                _, request = items[0]
                span.set_attributes(
                    {
                        JOB_ID: result.id,
                        JOB_KEY: result.key,
                        JOB_QUEUE: request.queue or "default",
                        JOB_TENANT: request.tenant or "",
                    }
                )

    # attempts ------------------------------------------------------------------------------
    def start_attempt(self, job: Job) -> tuple[Span, object]:
        """Start the span of one attempt as the child of the job's stored context and make it
        current (the http effect sends it on as `traceparent`); `end_attempt` ends it."""
        span = self._tracer.start_span(
            "dispatcher.attempt",
            context=context_of(job.traceparent),
            kind=SpanKind.CONSUMER,
            attributes={
                JOB_ID: job.id,
                JOB_KEY: job.key,
                JOB_QUEUE: job.queue,
                JOB_TENANT: job.tenant,
                JOB_HANDLER: job.handler,
                JOB_ATTEMPT: job.attempt,
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        return span, token

    @staticmethod
    def end_attempt(span: Span, token: object, outcome: str, error: str | None = None) -> None:
        """Record the attempt's outcome (succeeded, retry, dead, cancelled, lease_lost,
        interrupted by a drain, unrecorded) and end its span."""
        context.detach(token)  # type: ignore[arg-type]
        span.set_attribute(ATTEMPT_OUTCOME, outcome)
        if outcome not in _FINE:
            span.set_status(Status(StatusCode.ERROR, error or outcome))
        span.end()

    # the process ---------------------------------------------------------------------------
    def close(self) -> None:
        """Export what is buffered and stop the exporter (a provider this object built)."""
        if not self._owned:
            return
        shutdown = getattr(self._provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def from_environment(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the standard `OTEL_*` variables ask, or None (off, the default).

    On when `OTEL_TRACES_EXPORTER` names an exporter other than `none`, or when an OTLP
    endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT`); off when
    `OTEL_SDK_DISABLED=true`. A tracer provider already installed globally is used as it is.
    The exporters read the rest of their variables themselves (headers, timeout, compression,
    certificate; `OTEL_BSP_*` for batching; `OTEL_TRACES_SAMPLER*`; `OTEL_SERVICE_NAME` and
    `OTEL_RESOURCE_ATTRIBUTES`). A ConfigError names the variable and the fix."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    installed = trace.get_tracer_provider()
    if not isinstance(installed, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return Tracing(installed, about="the tracer provider installed in this process")
    exporters = _exporters(env)
    if not exporters:
        return None
    return _build(env, exporters)


def _exporters(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: unknown exporter {unknown[0]!r}; use one of "
            f"{', '.join(EXPORTERS)} (or unset it and set OTEL_EXPORTER_OTLP_ENDPOINT)"
        )
    return [name for name in names if name != "none"]


def _build(env: Mapping[str, str], exporters: list[str]) -> Tracing:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise ConfigError(
            "OTEL_*: tracing is asked for, but the OpenTelemetry SDK is not installed; "
            "install the extra: pip install 'dispatcher[tracing]' (or unset the OTEL_* variables)"
        ) from None
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (read by Resource.create) name the service;
    # without them it is "dispatcher", not the SDK's "unknown_service"
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "dispatcher"}))
    provider = TracerProvider(resource=resource)
    about = []
    for name in exporters:
        exporter: SpanExporter
        if name == "console":
            exporter, where = ConsoleSpanExporter(), "standard output"
        else:
            exporter, where = _otlp_exporter(env)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        about.append(where)
    return Tracing(provider, owned=True, about=", ".join(about))


def _otlp_exporter(env: Mapping[str, str]) -> tuple[Any, str]:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    endpoint = _otlp_endpoint(env, protocol)
    if protocol == "http/protobuf":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_*: the OTLP exporter is not installed; install the extra: "
                "pip install 'dispatcher[tracing]'"
            ) from None
        return OTLPSpanExporter(endpoint=endpoint), f"OTLP over HTTP to {endpoint}"
    if protocol == "grpc":
        try:  # not a dependency: imported by name, so type checks pass without it
            grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the package "
                "opentelemetry-exporter-otlp-proto-grpc; install it, or use http/protobuf "
                "(the default, installed with dispatcher[tracing])"
            ) from None
        return grpc.OTLPSpanExporter(endpoint=endpoint), f"OTLP over gRPC to {endpoint}"
    raise ConfigError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported; use one of "
        f"{', '.join(PROTOCOLS)}"
    )


def _otlp_endpoint(env: Mapping[str, str], protocol: str) -> str:
    """Where spans go, by the OTLP exporter specification: the signal's own endpoint as it
    is; the general one with `/v1/traces` appended (HTTP); else the local collector."""
    own = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if protocol == "grpc":
        return own or general or "http://localhost:4317"
    if own:
        return own
    if general:
        return general.rstrip("/") + "/v1/traces"
    return "http://localhost:4318/v1/traces"
