"""The named schemas of what the API shows and takes beyond a new job: a job and its attempts,
a queue with its live settings, an operator's requests and a bulk action's result. The OpenAPI
document's components (dispatcher.api.contract) include them."""

from __future__ import annotations

from typing import Any

from dispatcher.api.schemas import RescheduleRequest
from dispatcher.intake.requests import DeadLetterRequest
from dispatcher.model import STATES
from dispatcher.operator.queue_limits import SettingsChange

ATTEMPT_OUTCOMES = (
    "succeeded",
    "retried",
    "dead",
    "cancelled",
    "lease_expired",
    "released",
    "snoozed",
)


def operator_schemas() -> dict[str, Any]:
    template = "#/components/schemas/{model}"
    nullable_str = {"type": ["string", "null"]}
    return {
        "RescheduleRequest": RescheduleRequest.model_json_schema(ref_template=template),
        "DeadLetterRequest": DeadLetterRequest.model_json_schema(ref_template=template),
        "SettingsChange": SettingsChange.model_json_schema(ref_template=template),
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


def job_schemas() -> dict[str, Any]:
    """A job as the API shows it, and one attempt of its history."""
    nullable_str = {"type": ["string", "null"]}
    return {
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
                "priority": {"type": "integer", "minimum": -100, "maximum": 100},
                "concurrency_key": nullable_str,
                "tenant": nullable_str,
                "handler": {"type": "string"},
                "run_key": nullable_str,
                "dead_letter_of": {
                    "type": ["integer", "null"],
                    "description": "a dead-letter notification: the job it reports on",
                },
                "timeout_s": {
                    "type": ["number", "null"],
                    "description": "the job's own deadline per attempt (null: the handler's)",
                },
                "expires_at": {
                    **nullable_str,
                    "format": "date-time",
                    "description": "no attempt starts after it (null: never expires)",
                },
                "on_success": {
                    "type": ["object", "null"],
                    "description": "the target pushed when it succeeds (header values and URL "
                    "secrets masked)",
                },
                "on_failure": {
                    "type": ["object", "null"],
                    "description": "the target pushed when it dies (masked as on_success)",
                },
                "replaced": {
                    "type": ["object", "null"],
                    "description": "what key modes did (null: never replaced): on_key of the "
                    "last replacement, times, last_at, due_at_bound (the latest due time its "
                    "debounce_max_s allows, null: none)",
                },
            },
        },
    }
