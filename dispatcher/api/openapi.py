"""The OpenAPI 3.1 description served at /openapi.json (request schemas generated from models)."""

from __future__ import annotations

from functools import cache
from typing import Any

from dispatcher import __version__
from dispatcher.api.schemas import (
    MAX_BATCH,
    BatchItem,
    RescheduleRequest,
)
from dispatcher.api.scopes import required_scope
from dispatcher.config.settings import NAME_PATTERN
from dispatcher.intake.requests import DeadLetterRequest, JobRequest
from dispatcher.model import STATES
from dispatcher.operator.queue_limits import SettingsChange

PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _problem_responses(*codes: int) -> dict[str, Any]:
    return {
        str(code): {
            "description": "problem",
            "content": {"application/problem+json": {"schema": PROBLEM}},
        }
        for code in codes
    }


def _json(schema: dict[str, Any], description: str = "ok") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
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
ATTEMPT_OUTCOMES = ("succeeded", "retried", "dead", "cancelled", "lease_expired", "released")
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


def _describe_api() -> dict[str, Any]:
    job_request = JobRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    batch_item = BatchItem.model_json_schema(ref_template="#/components/schemas/{model}")
    nullable_str = {"type": ["string", "null"]}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dispatcher",
            "version": __version__,
            "description": "Durable delayed jobs on PostgreSQL. Errors are RFC 9457 problems.",
        },
        "components": {
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
                    },
                },
                "Attempt": {
                    "type": "object",
                    "required": ["attempt", "outcome", "owner", "finished_at"],
                    "properties": {
                        "attempt": {"type": "integer"},
                        "outcome": {"enum": list(ATTEMPT_OUTCOMES)},
                        "reason": {
                            **nullable_str,
                            "description": "why it failed: timeout, transient, rate_limited, "
                            "error or a permanent failure's code; for dead, the dead reason",
                        },
                        "owner": {"type": "string", "description": "the lease owner"},
                        "started_at": nullable_str,
                        "finished_at": {"type": "string", "format": "date-time"},
                        "http_status": {"type": ["integer", "null"]},
                        "latency_s": {"type": ["number", "null"]},
                        "excerpt": {
                            **nullable_str,
                            "maxLength": 500,
                            "description": "the error, or an http success's response start",
                        },
                    },
                },
                "Job": {
                    "type": "object",
                    "required": ["id", "key", "state", "attempt", "due_at"],
                    "properties": {
                        "id": {"type": "integer"},
                        "key": {"type": "string"},
                        "state": {"enum": list(STATES)},
                        "queue": {"type": "string"},
                        "attempt": {"type": "integer"},
                        "due_at": {"type": "string"},
                        "created_at": {"type": "string"},
                        "started_at": nullable_str,
                        "finished_at": nullable_str,
                        "last_error": nullable_str,
                        "dead_reason": nullable_str,
                        "tenant": nullable_str,
                        "handler": {"type": "string"},
                        "run_key": nullable_str,
                        "dead_letter_of": {
                            "type": ["integer", "null"],
                            "description": "a dead-letter notification: the job it reports on",
                        },
                    },
                },
                **_operator_schemas(),
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/jobs": {
                "post": {
                    "summary": "Accept a job (idempotent by Idempotency-Key)",
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": True,
                            "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                        },
                        TRACEPARENT_HEADER,
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/JobRequest"}
                            }
                        },
                    },
                    "responses": {
                        "202": _json(ACCEPTED, "accepted (or the same request replayed)"),
                        **_problem_responses(400, 401, 409, 413, 422, 503),
                    },
                },
                "get": {
                    "summary": "List jobs, newest first (a due window: earliest due first)",
                    "description": (
                        "Summaries of the jobs matching every filter given (an empty value "
                        "filters nothing). `key` is exact: the one job, or an empty list. "
                        "`due_after` is inclusive, `due_before` exclusive; with either, items "
                        "come earliest due first. Pass `next_cursor` as `cursor`, with the same "
                        "filters, for the next page. An unknown or repeated parameter is a 422."
                    ),
                    "parameters": [
                        {"name": "state", "in": "query", "schema": {"enum": list(STATES)}},
                        {"name": "queue", "in": "query", "schema": {"type": "string"}},
                        *LIST_FILTERS,
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                        {
                            "name": "cursor",
                            "in": "query",
                            "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                        },
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "items": {"type": "array", "items": JOB},
                                    "next_cursor": nullable_str,
                                },
                            }
                        ),
                        **_problem_responses(401, 422),
                    },
                },
            },
            "/v1/jobs/batch": {
                "post": {
                    "summary": f"Accept up to {MAX_BATCH} jobs; per-item results in order",
                    "parameters": [TRACEPARENT_HEADER],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
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
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "results": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["index", "status"],
                                        },
                                    }
                                },
                            }
                        ),
                        **_problem_responses(400, 401, 413, 422),
                    },
                },
            },
            "/v1/jobs/{id}": {
                "get": {
                    "summary": "Job status",
                    "parameters": [JOB_ID],
                    "responses": {"200": _json(JOB), **_problem_responses(401, 404)},
                }
            },
            "/v1/jobs/{id}/attempts": {
                "get": {
                    "summary": "The job's attempt history, newest first",
                    "description": (
                        "One item per attempt that ended: succeeded, retried, dead, cancelled, "
                        "lease_expired (its worker vanished) or released (handed back by a "
                        "graceful drain; not counted, so the next attempt has the same number). "
                        "Rows go when the job is pruned."
                    ),
                    "parameters": [
                        JOB_ID,
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["job_id", "items", "next_cursor"],
                                "properties": {
                                    "job_id": {"type": "integer"},
                                    "items": {"type": "array", "items": ATTEMPT},
                                    "next_cursor": nullable_str,
                                },
                            }
                        ),
                        **_problem_responses(401, 404, 422),
                    },
                }
            },
            "/v1/jobs/{id}/retry": {
                "post": {
                    "summary": "Retry a dead or cancelled job with a fresh attempt budget",
                    "parameters": [JOB_ID],
                    "responses": {"200": _json(JOB), **_problem_responses(401, 404, 409)},
                }
            },
            "/v1/jobs/{id}/cancel": {
                "post": {
                    "summary": "Cancel a waiting job; a running one is not retried",
                    "parameters": [JOB_ID],
                    "responses": {"200": _json(JOB), **_problem_responses(401, 404, 409)},
                }
            },
            **_operator_paths(),
            "/v1/schedules": {
                "get": {
                    "summary": "Schedules, last runs, missed periods, paused or not",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"schedules": {"type": "array", "items": SCHEDULE}},
                            }
                        ),
                        **_problem_responses(401),
                    },
                }
            },
            "/v1/schedules/{name}/trigger": {
                "post": {
                    "summary": "Create the run of one explicit period (idempotent); a dry run "
                    "says whether it would create it",
                    "description": "Works on a paused schedule too (an explicit request). "
                    "`dry_run`: 200 with `outcome` `would_create` or `existing`, nothing created.",
                    "parameters": [SCHEDULE_NAME],
                    "requestBody": _json_body(
                        {
                            "type": "object",
                            "required": ["period_start"],
                            "additionalProperties": False,
                            "properties": {
                                "period_start": {"type": "string", "format": "date-time"},
                                "dry_run": {"type": "boolean", "default": False},
                            },
                        }
                    ),
                    "responses": {
                        "200": _json(RUN, "the run existed already (or the dry run's answer)"),
                        "202": _json(RUN, "the run was created"),
                        **_problem_responses(400, 401, 404, 422, 503),
                    },
                }
            },
            "/v1/schedules/{name}/catch-up": {
                "post": {
                    "summary": "Create the runs of every period in [from, to] that has none "
                    "(idempotent); a dry run lists them and creates nothing",
                    "description": "Missed periods (reasons not_fired, coalesced, disabled, "
                    "paused) are never backfilled on their own; this is the explicit way. "
                    "At most 1,000 periods per request; `to` may not lie in the future.",
                    "parameters": [SCHEDULE_NAME],
                    "requestBody": _json_body(
                        {
                            "type": "object",
                            "required": ["from", "to"],
                            "additionalProperties": False,
                            "properties": {
                                "from": {"type": "string", "format": "date-time"},
                                "to": {"type": "string", "format": "date-time"},
                                "dry_run": {"type": "boolean", "default": False},
                            },
                        }
                    ),
                    "responses": {
                        "200": _json(CATCH_UP, "nothing created (every run existed, or a dry run)"),
                        "202": _json(CATCH_UP, "runs created"),
                        **_problem_responses(400, 401, 404, 422, 503),
                    },
                }
            },
            "/v1/schedules/{name}/pause": {
                "post": {
                    "summary": "Pause a schedule on every daemon of this database (idempotent)",
                    "description": "Persisted; holds across restarts. Its periods are recorded "
                    "as missed with reason `paused` and never backfilled silently; explicit "
                    "triggers and catch-up still work. Answers the schedule's status.",
                    "parameters": [SCHEDULE_NAME],
                    "responses": {
                        "200": _json(SCHEDULE),
                        **_problem_responses(401, 404, 503),
                    },
                }
            },
            "/v1/schedules/{name}/resume": {
                "post": {
                    "summary": "Resume a paused schedule (idempotent)",
                    "description": "The periods that passed while paused stay listed as missed "
                    "(`paused`) for an explicit catch-up. Answers the schedule's status.",
                    "parameters": [SCHEDULE_NAME],
                    "responses": {
                        "200": _json(SCHEDULE),
                        **_problem_responses(401, 404, 503),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Alive",
                    "security": [],
                    "responses": {"200": _json({"type": "object"})},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Database reachable, schema current, not draining",
                    "security": [],
                    "responses": {
                        "200": _json({"type": "object"}),
                        "503": _json({"type": "object"}, "not ready"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "security": [],
                    "responses": {"200": {"description": "text exposition format"}},
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": _json({"type": "object"})},
                }
            },
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


def _operator_schemas() -> dict[str, Any]:
    template = "#/components/schemas/{model}"
    nullable_str = {"type": ["string", "null"]}
    return {
        "RescheduleRequest": RescheduleRequest.model_json_schema(ref_template=template),
        "DeadLetterRequest": DeadLetterRequest.model_json_schema(ref_template=template),
        "BulkResult": {
            "type": "object",
            "required": ["action", "dry_run", "count"],
            "properties": {
                "action": {"enum": ["redrive", "discard"]},
                "dry_run": {"type": "boolean"},
                "count": {
                    "type": "integer",
                    "description": "jobs moved (a dry run: jobs that match, up to limit)",
                },
                "batches": {"type": "integer", "description": "statements of at most 1,000"},
            },
        },
        "Queue": {
            "type": "object",
            "required": ["name", "paused", "jobs", "limits"],
            "properties": {
                "name": {"type": "string"},
                "paused": {"type": "boolean"},
                "paused_at": {**nullable_str, "format": "date-time"},
                "configured_here": {
                    "type": "boolean",
                    "description": "this daemon's configuration has the queue (and its limits)",
                },
                "jobs": {
                    "type": "object",
                    "description": "jobs per state (sampled, at most a second old; estimated "
                    "from planner statistics above a million jobs)",
                    "properties": {state: {"type": "integer"} for state in STATES},
                },
                "oldest_ready_age_s": {"type": "number"},
                "overdue": {"type": "integer"},
                "limits": {"type": "object"},
                "on_dead": {
                    "type": ["object", "null"],
                    "description": "where dead letters are reported (the target's origin only)",
                },
                "settings": {
                    "type": "object",
                    "description": "each live setting (rate_per_s, burst, max_inflight, "
                    "key_max_inflight, key_rate_per_s, key_burst, windows) in force: value, "
                    'source ("override", "file" or null) and the file\'s value',
                },
                "overrides_at": {**nullable_str, "format": "date-time"},
                "window_open": {
                    "type": "boolean",
                    "description": "the queue may claim by its run windows (always without)",
                },
                "window_opens_at": {**nullable_str, "format": "date-time"},
                "window_closes_at": {**nullable_str, "format": "date-time"},
                "window_error": {
                    **nullable_str,
                    "description": "windows stored past every door that cannot be read "
                    "(the daemons keep the last good ones)",
                },
            },
        },
    }


def _operator_paths() -> dict[str, Any]:
    conflict = _problem_responses(401, 404, 409, 503)
    bulk = {
        "requestBody": _json_body({"$ref": "#/components/schemas/DeadLetterRequest"}),
        "responses": {"200": _json(BULK_RESULT), **_problem_responses(400, 401, 422, 503)},
    }
    bulk_text = (
        "Dead jobs matching every filter given (at least one, or `all`), in batches of 1,000, "
        "each committed on its own; only jobs dead when the call began. Idempotent: repeating "
        "a finished call moves nothing. `dry_run` counts and changes nothing."
    )
    return {
        "/v1/jobs/{id}/discard": {
            "post": {
                "summary": "Discard a dead job: terminal `discarded`, kept for the dead retention",
                "parameters": [JOB_ID],
                "responses": {"200": _json(JOB), **conflict},
            }
        },
        "/v1/jobs/{id}/reschedule": {
            "post": {
                "summary": 'Move a scheduled or ready job to another due time, or "now"',
                "description": "Later than now: `scheduled` (a ready job's outbox row is "
                "withdrawn). Now or earlier: `ready` at once. The idempotency fingerprint is "
                "unchanged. Running and terminal jobs: 409 naming the state.",
                "parameters": [JOB_ID],
                "requestBody": _json_body({"$ref": "#/components/schemas/RescheduleRequest"}),
                "responses": {"200": _json(JOB), **conflict, **_problem_responses(422)},
            }
        },
        "/v1/jobs/redrive": {
            "post": {
                "summary": "Bulk redrive: dead jobs back to ready with a fresh attempt budget",
                "description": bulk_text,
                **bulk,
            }
        },
        "/v1/jobs/discard": {
            "post": {
                "summary": "Bulk discard of dead jobs",
                "description": bulk_text,
                **bulk,
            }
        },
        "/v1/queues": {
            "get": {
                "summary": "Queues: paused or not, jobs per state, oldest ready age, limits",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"queues": {"type": "array", "items": QUEUE}},
                        }
                    ),
                    **_problem_responses(401, 503),
                },
            }
        },
        "/v1/queues/{name}/pause": {
            "post": {
                "summary": "Pause a queue on every daemon of this database (idempotent)",
                "description": "Persisted; holds across restarts. Nothing of the queue is "
                "claimed; running attempts finish; intake and the due-scan go on. Answers the "
                "queue.",
                "parameters": [QUEUE_NAME],
                "responses": {"200": _json(QUEUE), **_problem_responses(401, 404, 503)},
            }
        },
        "/v1/queues/{name}/resume": {
            "post": {
                "summary": "Resume a paused queue (idempotent); its backlog starts at once",
                "parameters": [QUEUE_NAME],
                "responses": {"200": _json(QUEUE), **_problem_responses(401, 404, 503)},
            }
        },
        "/v1/queues/{name}": {
            "patch": {
                "summary": "Change a queue's limits or run windows at run time",
                "description": "A JSON merge patch of the live settings: a value sets a "
                "run-time override, null removes one. Persisted; every daemon honours it within "
                "a second; an override wins over the configuration file, also after a restart, "
                "until reset. 422 names the field at fault; nothing changes.",
                "parameters": [QUEUE_NAME],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": SettingsChange.model_json_schema()}},
                },
                "responses": {"200": _json(QUEUE), **_problem_responses(400, 401, 404, 422, 503)},
            }
        },
        "/v1/queues/{name}/reset": {
            "post": {
                "summary": "Remove every run-time override of a queue (the file's settings hold)",
                "parameters": [QUEUE_NAME],
                "responses": {"200": _json(QUEUE), **_problem_responses(401, 404, 503)},
            }
        },
    }


# Any request can be malformed at the HTTP level (a bad header, a broken length); the server
# answers 400 before routing, in plain text when it never reached the application.
MALFORMED = {
    "description": "malformed request",
    "content": {
        "application/problem+json": {"schema": PROBLEM},
        "text/plain": {"schema": {"type": "string"}},
    },
}


@cache
def openapi_document() -> dict[str, Any]:
    document = _describe_api()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            operation["responses"].setdefault("400", MALFORMED)
            if "requestBody" in operation:  # any body past body_limit_bytes
                operation["responses"].setdefault("413", _problem_responses(413)["413"])
            if operation.get("security") != []:  # [] marks the public routes
                _require_scope(operation, required_scope(method.upper(), path))
    return document


def _require_scope(operation: dict[str, Any], scope: str) -> None:
    """The token scope the route needs (dispatcher.api.scopes), as a role of the bearer scheme
    (OpenAPI 3.1), and the answers to a token that is missing (401) or lacks it (403), and to
    an address refused after too many wrong tokens (429, with Retry-After)."""
    operation["security"] = [{"bearer": [scope]}]
    operation["description"] = (
        operation.get("description", "") + f" Needs a token with scope `{scope}`."
    ).strip()
    for code, answer in _problem_responses(401, 403, 429).items():
        operation["responses"].setdefault(code, answer)
