"""The pieces the OpenAPI description is made of: component schemas (request schemas generated
from the request models), shared parameters, and the helpers that write responses. The route
table (dispatcher.api.routes) names them per operation."""

from __future__ import annotations

from typing import Any

from dispatcher.api.resource_schemas import job_schemas, operator_schemas
from dispatcher.api.schemas import MAX_BATCH, BatchItem
from dispatcher.config.settings import NAME_PATTERN
from dispatcher.db.job_reads import PREFIX_SCAN_IDS, PREFIX_SLICE_IDS
from dispatcher.intake.requests import JobRequest
from dispatcher.model import STATES

PROBLEM = {"$ref": "#/components/schemas/Problem"}


def problem_responses(*codes: int) -> dict[str, Any]:
    return {
        str(code): {
            "description": "problem",
            "content": {"application/problem+json": {"schema": PROBLEM}},
        }
        for code in codes
    }


def json_ok(schema: dict[str, Any], description: str = "ok") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


JOB_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9]+$"},
}
JOB = {"$ref": "#/components/schemas/Job"}
TRACEPARENT_HEADER = {
    "name": "traceparent",
    "in": "header",
    "required": False,
    "description": (
        "W3C trace context of the producer (README: Tracing). While tracing is on, the jobs "
        "created join its trace and their pushes carry it on; a batch's header applies to "
        "every item. An invalid or repeated header is ignored, never refused."
    ),
    "schema": {"type": "string"},
}
ATTEMPT = {"$ref": "#/components/schemas/Attempt"}
SCHEDULE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
# A run receipt (trigger), or what a dry run would do for the period (`outcome`
# would_create | existing, `units`: the unit count when the fan-out is static).
RUN = {
    "type": "object",
    "required": ["run_key", "period_start", "outcome"],
    "properties": {
        "run_key": {"type": "string"},
        "period_start": {"type": "string", "format": "date-time"},
        "outcome": {"enum": ["created", "existing", "would_create"]},
        "dry_run": {"type": "boolean"},
        "units": {"type": ["object", "integer", "null"]},
    },
}
CATCH_UP = {
    "type": "object",
    "required": ["schedule", "dry_run", "runs"],
    "properties": {
        "schedule": {"type": "string"},
        "dry_run": {"type": "boolean"},
        "runs": {"type": "array", "items": RUN},
        "created": {"type": "integer"},
        "would_create": {"type": "integer"},
        "existing": {"type": "integer"},
    },
}
SCHEDULE = {
    "type": "object",
    "required": ["name", "enabled", "paused"],
    "properties": {
        "name": {"type": "string"},
        "enabled": {"type": "boolean"},
        "paused": {"type": "boolean"},
        "paused_at": {"type": ["string", "null"], "format": "date-time"},
        "next_fire_at": {"type": ["string", "null"], "format": "date-time"},
        "description": {"type": "string", "description": "the cron expression in words"},
        "next_fires": {
            "type": "array",
            "description": "the next fire times (up to 5): `at` in UTC, `local` in the "
            "schedule's time zone with its offset",
            "items": {
                "type": "object",
                "properties": {
                    "at": {"type": "string", "format": "date-time"},
                    "local": {"type": "string", "format": "date-time"},
                },
            },
        },
        "missed": {"type": "object"},
        "last_run": {"type": ["object", "null"]},
        "on_finished": {"type": ["object", "null"]},
    },
}
ACCEPTED = {"$ref": "#/components/schemas/Accepted"}
PRINTABLE_ASCII = "^[ -~]{1,255}$"
CURSOR_PATTERN = "^[0-9]{1,18}([.][0-9]{1,18})?$"
# GET /v1/jobs: the filters beside state and queue (dispatcher.api.filters checks them)
LIST_FILTERS = [
    {
        "name": "key",
        "in": "query",
        "description": "an idempotency key (exact; surrounding spaces and tabs dropped)",
        "schema": {"type": "string", "pattern": PRINTABLE_ASCII},
    },
    {
        "name": "tenant",
        "in": "query",
        "description": "jobs of this tenant (UTF-8, no NUL)",
        "schema": {"type": "string", "maxLength": 255},
    },
    {
        "name": "priority",
        "in": "query",
        "description": "jobs of this priority (-100 to 100; lower runs first)",
        "schema": {"type": "integer", "minimum": -100, "maximum": 100},
    },
    {
        "name": "reason",
        "in": "query",
        "description": "dead (and discarded) jobs with this dead reason, exact, as the "
        "dead-letter groups show it; served by the index jobs_dead_reason_id",
        "schema": {"type": "string", "maxLength": 200},
    },
    {
        "name": "key_prefix",
        "in": "query",
        "description": "jobs whose idempotency key starts with this text (% and _ match "
        "themselves); served by the index jobs_key_prefix_id when fewer than "
        f"{PREFIX_SCAN_IDS:,} keys below the cursor match, else {PREFIX_SLICE_IDS:,} ids at "
        "most a page (see `searched_ids`)",
        "schema": {"type": "string", "pattern": PRINTABLE_ASCII},
    },
    {
        "name": "error",
        "in": "query",
        "description": "jobs whose last error contains this text, any case (% and _ match "
        "themselves); served by the trigram index jobs_last_error_trgm where pg_trgm could be "
        "created, else only the newest 100,000 jobs are searched",
        "schema": {"type": "string", "minLength": 3, "maxLength": 200},
    },
    {
        "name": "concurrency_key",
        "in": "query",
        "description": "jobs of this concurrency key, exact (a job accepted without one has its "
        "tenant's); served by the index intents_concurrency_key_id",
        "schema": {"type": "string", "maxLength": 200},
    },
    {
        "name": "run_key",
        "in": "query",
        "description": "units of one cron run, e.g. nightly:2026-05-31T02:00:00Z",
        "schema": {"type": "string", "pattern": PRINTABLE_ASCII},
    },
    {
        "name": "handler",
        "in": "query",
        "description": '"http" or a handler name from the configuration',
        "schema": {"type": "string", "pattern": NAME_PATTERN},
    },
    {
        "name": "due_before",
        "in": "query",
        "description": "due before this time (exclusive), RFC 3339 with offset",
        "schema": {"type": "string", "format": "date-time"},
    },
    {
        "name": "due_after",
        "in": "query",
        "description": "due at or after this time (inclusive), RFC 3339 with offset",
        "schema": {"type": "string", "format": "date-time"},
    },
]


# Any request can be malformed at the HTTP level (a bad header, a broken length); the server
# answers 400 before routing, in plain text when it never reached the application.
MALFORMED = {
    "description": "malformed request",
    "content": {
        "application/problem+json": {"schema": PROBLEM},
        "text/plain": {"schema": {"type": "string"}},
    },
}


# dead letters, reschedule, paused queues (operator control) ----------------------------------
QUEUE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "a queue of the registry (GET /v1/queues); 404 lists them",
}
BULK_RESULT = {"$ref": "#/components/schemas/BulkResult"}
QUEUE = {"$ref": "#/components/schemas/Queue"}


# request and response schemas of single operations (dispatcher.api.routes)
NULLABLE_STR = {"type": ["string", "null"]}
LIMIT = {
    "name": "limit",
    "in": "query",
    "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
}
JOB_LIST = {
    "type": "object",
    "required": ["items", "next_cursor", "searched_ids"],
    "properties": {
        "items": {"type": "array", "items": JOB},
        "next_cursor": {
            "type": ["string", "null"],
            "description": "pass as `cursor` (with the same filters) for the next page, or to "
            "search older jobs after `searched_ids`; null: no more matches",
        },
        "searched_ids": {
            "type": ["object", "null"],
            "required": ["oldest", "newest"],
            "properties": {"oldest": {"type": "integer"}, "newest": {"type": "integer"}},
            "description": "set when a key-prefix search with many matches stopped at its "
            f"bound ({PREFIX_SLICE_IDS:,} ids) before filling the page: the ids it looked at, both "
            "included; every match among them is in `items`, and `next_cursor` continues "
            "with the jobs older than `oldest`. null: `items` is the whole answer up to "
            "`limit`",
        },
    },
}
BATCH_REQUEST = {
    "type": "object",
    "required": ["jobs"],
    "additionalProperties": False,
    "properties": {
        "jobs": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_BATCH,
            "items": {"$ref": "#/components/schemas/BatchItem"},
        }
    },
}
BATCH_RESULTS = {
    "type": "object",
    "properties": {
        "results": {
            "type": "array",
            "items": {"type": "object", "required": ["index", "status"]},
        }
    },
}
ATTEMPT_PAGE = {
    "type": "object",
    "required": ["job_id", "items", "next_cursor"],
    "properties": {
        "job_id": {"type": "integer"},
        "items": {"type": "array", "items": ATTEMPT},
        "next_cursor": NULLABLE_STR,
    },
}
BULK_TEXT = (
    "Dead jobs matching every filter given (at least one, or `all`), in batches of 1,000, "
    "each committed on its own; only jobs dead when the call began. Idempotent: repeating "
    "a finished call moves nothing. `dry_run` counts and changes nothing."
)
TRIGGER_REQUEST = {
    "type": "object",
    "required": ["period_start"],
    "additionalProperties": False,
    "properties": {
        "period_start": {"type": "string", "format": "date-time"},
        "dry_run": {"type": "boolean", "default": False},
    },
}
CATCH_UP_REQUEST = {
    "type": "object",
    "required": ["from", "to"],
    "additionalProperties": False,
    "properties": {
        "from": {"type": "string", "format": "date-time"},
        "to": {"type": "string", "format": "date-time"},
        "dry_run": {"type": "boolean", "default": False},
    },
}
ANY_OBJECT = {"type": "object"}
KEY_NAME = {
    "name": "key",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    "description": "a concurrency key (a job's concurrency_key; by default its tenant)",
}
_OPTIONAL_INT = {"type": ["integer", "null"], "minimum": 1}
KEY_LIMITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "max_inflight": {**_OPTIONAL_INT, "maximum": 100_000},
        "rate_per_s": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1e9},
        "burst": {**_OPTIONAL_INT, "maximum": 2_147_483_647},
    },
}
KEY_OVERRIDE = {
    "type": "object",
    "properties": {
        "queue": {"type": "string"},
        "key": {"type": "string"},
        "max_inflight": {"type": ["integer", "null"]},
        "rate_per_s": {"type": ["number", "null"]},
        "burst": {"type": ["integer", "null"]},
        "updated_at": {"type": "string", "format": "date-time"},
    },
}


def components() -> dict[str, Any]:
    """The document's `components`: the bearer scheme and every named schema."""
    job_request = JobRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    batch_item = BatchItem.model_json_schema(ref_template="#/components/schemas/{model}")
    return {
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": (
                    "A token from DISPATCHER_API_TOKENS or DISPATCHER_API_TOKENS_FILE, when "
                    "any is configured. Each token has scopes: read (GET), enqueue (POST "
                    "/v1/jobs, /v1/jobs/batch), operate (everything that changes existing "
                    "jobs, queues or schedules); each operation lists the one it needs."
                ),
            }
        },
        "schemas": {
            "JobRequest": job_request,
            "BatchItem": batch_item,
            "Problem": {
                "type": "object",
                "required": ["title", "status", "detail"],
                "properties": {
                    "type": {"type": "string"},
                    "title": {"type": "string"},
                    "status": {"type": "integer"},
                    "detail": {"type": "string"},
                },
            },
            "Accepted": {
                "type": "object",
                "required": ["id", "key", "state", "due_at"],
                "properties": {
                    "id": {"type": "integer"},
                    "key": {"type": "string"},
                    "state": {"enum": list(STATES)},
                    "due_at": {"type": "string", "format": "date-time"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "replaced": {"const": True, "description": "on_key replaced the job"},
                },
            },
            "Pruned": {
                "type": "object",
                "required": ["id", "key", "state", "pruned", "detail"],
                "properties": {
                    "id": {"type": "integer"},
                    "key": {"type": "string"},
                    "state": {"enum": list(STATES)},
                    "pruned": {"const": True},
                    "detail": {"type": "string"},
                },
            },
            **job_schemas(),
            **operator_schemas(),
        },
    }
