"""The HTTP API as one table: each row is a route (method, path), the token scope it needs, its
handler, and what the OpenAPI document says of it (summary, parameters, request and response
schemas, the problems it answers). The router (`create_app`), the scope check
(dispatcher.api.scopes) and /openapi.json (dispatcher.api.openapi) are all read from `ROUTES`,
so a route cannot exist without its scope and its description (tests/unit/test_route_scopes.py).

Each row is a `Route` (dispatcher.api.route). Adding an operator action: a method of the
operator service, a handler in dispatcher.api.operate, and one row here (docs/architecture.md,
"Adding an operator action").
"""

from __future__ import annotations

from dispatcher.api import bulk, health, history, jobs, operate
from dispatcher.api.contract import (
    ACCEPTED,
    ANY_OBJECT,
    ATTEMPT_PAGE,
    BATCH_REQUEST,
    BATCH_RESULTS,
    BULK_RESULT,
    BULK_TEXT,
    CATCH_UP,
    CATCH_UP_REQUEST,
    CURSOR_PATTERN,
    IDEMPOTENCY_KEY,
    JOB,
    JOB_ID,
    JOB_LIST,
    KEY_LIMITS,
    KEY_NAME,
    KEY_OVERRIDE,
    LIMIT,
    LIST_FILTERS,
    QUEUE,
    QUEUE_NAME,
    RUN,
    SCHEDULE,
    SCHEDULE_NAME,
    TRACEPARENT_HEADER,
    TRIGGER_REQUEST,
    json_ok,
)
from dispatcher.api.route import Route
from dispatcher.api.schemas import MAX_BATCH, RescheduleRequest
from dispatcher.db.job_reads import PREFIX_SCAN_IDS, PREFIX_SLICE_IDS
from dispatcher.intake.requests import DeadLetterRequest, JobRequest
from dispatcher.model import STATES
from dispatcher.operator.bulk import ACTIONS, BULK_BATCH, MAX_IDS
from dispatcher.operator.queue_limits import SettingsChange

JOB_ROUTES = [
    Route(
        "POST",
        "/v1/jobs",
        "enqueue",
        jobs.post_job,
        "Accept a job (idempotent by Idempotency-Key)",
        parameters=(IDEMPOTENCY_KEY, TRACEPARENT_HEADER),
        request=JobRequest,
        answers={
            "202": json_ok(ACCEPTED, "accepted (or the same request replayed, or replaced)"),
            "200": json_ok(
                {"$ref": "#/components/schemas/Pruned"},
                "the same request replayed after its job was pruned: the original id and "
                "final state (Idempotent-Replayed: true); nothing runs",
            ),
        },
        problems=(400, 401, 409, 413, 422, 503),
    ),
    Route(
        "GET",
        "/v1/jobs",
        "read",
        jobs.list_jobs,
        "List jobs, newest first (a due window: earliest due first)",
        description=(
            "Summaries of the jobs matching every filter given (an empty value filters "
            "nothing). `key` is exact: the one job, or an empty list. `due_after` is inclusive, "
            "`due_before` exclusive; with either, items come earliest due first. Pass "
            "`next_cursor` as `cursor`, with the same filters, for the next page, until it is "
            f"null. A `key_prefix` with {PREFIX_SCAN_IDS:,} or more matches below the cursor "
            f"looks at no more than {PREFIX_SLICE_IDS:,} ids a page, newest first: the page "
            "then holds the matches among them, perhaps fewer than `limit` or none, and "
            "`searched_ids` names the ids it looked at; its `next_cursor` searches the older "
            "ones. An unknown or repeated "
            "parameter, or a cursor that is not a `next_cursor` of this list, is a 422."
        ),
        parameters=(
            {"name": "state", "in": "query", "schema": {"enum": list(STATES)}},
            {"name": "queue", "in": "query", "schema": {"type": "string"}},
            *LIST_FILTERS,
            LIMIT,
            {
                "name": "cursor",
                "in": "query",
                "schema": {"type": "string", "pattern": CURSOR_PATTERN},
            },
        ),
        response=JOB_LIST,
        problems=(401, 422),
    ),
    Route(
        "POST",
        "/v1/jobs/batch",
        "enqueue",
        jobs.post_batch,
        f"Accept up to {MAX_BATCH} jobs; per-item results in order",
        parameters=(TRACEPARENT_HEADER,),
        request=BATCH_REQUEST,
        response=BATCH_RESULTS,
        problems=(400, 401, 413, 422),
    ),
    Route(
        "GET",
        "/v1/jobs/{id}",
        "read",
        jobs.get_job,
        "Job status",
        parameters=(JOB_ID,),
        response=JOB,
        problems=(401, 404),
    ),
    Route(
        "GET",
        "/v1/jobs/{id}/attempts",
        "read",
        jobs.list_attempts,
        "The job's attempt history, newest first",
        description=(
            "One item per attempt that ended: succeeded, retried, dead, cancelled, "
            "lease_expired (its worker vanished), released (handed back by a graceful drain) "
            "or snoozed (its python handler asked to run again later); the last two are not "
            "counted, so the next attempt has the same number. Rows go when the job is pruned."
        ),
        parameters=(JOB_ID, LIMIT, {"name": "cursor", "in": "query", "schema": {"type": "string"}}),
        response=ATTEMPT_PAGE,
        problems=(401, 404, 422),
    ),
]

# operate: changes what happens to existing jobs, queues and schedules (the bulk row comes
# first: /v1/jobs/{id}/retry would take /v1/jobs/bulk/retry for job "bulk")
OPERATOR_ROUTES = [
    Route(
        "POST",
        "/v1/jobs/bulk/{action}",
        "operate",
        bulk.bulk_jobs,
        "Bulk retry, cancel, discard, reschedule or run_now of jobs by ids or by filter",
        description=(
            f"`ids` (up to {MAX_IDS:,}) or `filter` (the job list's filters by name; an empty "
            f'one needs `"all": true`). In batches of {BULK_BATCH} jobs, each committed on its '
            "own; only jobs that existed when it began. A job moves only from the states its "
            "one-job action accepts; `skipped` counts the others per state with the reason, "
            "`busy` those locked or moved on meanwhile (ask again with a new key to take "
            "them). `Idempotency-Key` names the action: the same key resumes one cut off, and "
            "answers a finished one (`replayed`) without changing anything more; without one, "
            "each request is a new action (its key is `bulk_id`). `dry_run`: counts per state "
            'and a sample, nothing changed. A reschedule takes `due_at` ("now" or RFC 3339).'
        ),
        parameters=(
            {"name": "action", "in": "path", "required": True, "schema": {"enum": list(ACTIONS)}},
            {**IDEMPOTENCY_KEY, "required": False},
        ),
        request=bulk.BulkBody.model_json_schema(),
        response=bulk.ANSWER,
        problems=(400, 401, 409, 422, 503),
    ),
    Route(
        "POST",
        "/v1/jobs/{id}/retry",
        "operate",
        operate.retry_job,
        "Retry a dead or cancelled job with a fresh attempt budget",
        parameters=(JOB_ID,),
        response=JOB,
        problems=(401, 404, 409),
    ),
    Route(
        "POST",
        "/v1/jobs/{id}/cancel",
        "operate",
        operate.cancel_job,
        "Cancel a waiting job; a running one is not retried",
        parameters=(JOB_ID,),
        response=JOB,
        problems=(401, 404, 409),
    ),
    Route(
        "POST",
        "/v1/jobs/{id}/discard",
        "operate",
        operate.discard_job,
        "Discard a dead job: terminal `discarded`, kept for the dead retention",
        parameters=(JOB_ID,),
        response=JOB,
        problems=(401, 404, 409, 503),
    ),
    Route(
        "POST",
        "/v1/jobs/{id}/run-now",
        "operate",
        operate.job_action("run_now"),
        "Run a scheduled job now: ready at once, ahead of its due time",
        parameters=(JOB_ID,),
        response=JOB,
        problems=(401, 404, 409, 503),
    ),
    Route(
        "POST",
        "/v1/jobs/{id}/reschedule",
        "operate",
        operate.reschedule_job,
        'Move a scheduled or ready job to another due time, or "now"',
        description=(
            "Later than now: `scheduled` (a ready job's outbox row is withdrawn). Now or "
            "earlier: `ready` at once. The idempotency fingerprint is unchanged. Running and "
            "terminal jobs: 409 naming the state."
        ),
        parameters=(JOB_ID,),
        request=RescheduleRequest,
        response=JOB,
        problems=(401, 404, 409, 503, 422),
    ),
    Route(
        "POST",
        "/v1/jobs/redrive",
        "operate",
        operate.redrive_jobs,
        "Bulk redrive: dead jobs back to ready with a fresh attempt budget",
        description=BULK_TEXT,
        request=DeadLetterRequest,
        response=BULK_RESULT,
        problems=(400, 401, 422, 503),
    ),
    Route(
        "POST",
        "/v1/jobs/discard",
        "operate",
        operate.discard_jobs,
        "Bulk discard of dead jobs",
        description=BULK_TEXT,
        request=DeadLetterRequest,
        response=BULK_RESULT,
        problems=(400, 401, 422, 503),
    ),
    Route(
        "GET",
        "/v1/queues",
        "read",
        operate.list_queues,
        "Queues: paused or not, jobs per state, oldest ready age, limits",
        response={"type": "object", "properties": {"queues": {"type": "array", "items": QUEUE}}},
        problems=(401, 503),
    ),
    Route(
        "GET",
        "/v1/history",
        "read",
        history.get_history,
        "Cluster-wide history of a queue (or all): starts, outcomes, latency, oldest ready",
        description=history.HISTORY_TEXT,
        parameters=history.HISTORY_PARAMETERS,
        response=history.HISTORY,
        problems=(400, 401, 503),
    ),
    Route(
        "POST",
        "/v1/queues/{name}/pause",
        "operate",
        operate.pause_queue,
        "Pause a queue on every daemon of this database (idempotent)",
        description=(
            "Persisted; holds across restarts. Nothing of the queue is claimed; running "
            "attempts finish; intake and the due-scan go on. Answers the queue."
        ),
        parameters=(QUEUE_NAME,),
        response=QUEUE,
        problems=(401, 404, 503),
    ),
    Route(
        "POST",
        "/v1/queues/{name}/resume",
        "operate",
        operate.resume_queue,
        "Resume a paused queue (idempotent); its backlog starts at once",
        parameters=(QUEUE_NAME,),
        response=QUEUE,
        problems=(401, 404, 503),
    ),
    Route(
        "PUT",
        "/v1/queues/{name}/keys/{key}",
        "operate",
        operate.put_key_limits,
        "Give one concurrency key of a queue its own limits (persisted)",
        description=(
            "Any of max_inflight, rate_per_s, burst; a field left out takes the queue's key "
            "setting for this key. Every daemon's next claim honours it; a restart keeps it."
        ),
        parameters=(QUEUE_NAME, KEY_NAME),
        request=KEY_LIMITS,
        response=KEY_OVERRIDE,
        problems=(400, 401, 404, 422, 503),
    ),
    Route(
        "DELETE",
        "/v1/queues/{name}/keys/{key}",
        "operate",
        operate.delete_key_limits,
        "Put one concurrency key back on its queue's key limits (idempotent)",
        parameters=(QUEUE_NAME, KEY_NAME),
        response=ANY_OBJECT,
        problems=(401, 404, 503),
    ),
    Route(
        "PATCH",
        "/v1/queues/{name}",
        "operate",
        operate.patch_queue,
        "Change a queue's limits or run windows at run time",
        description=(
            "A JSON merge patch of the live settings: a value sets a run-time override, null "
            "removes one. Persisted; every daemon honours it within a second; an override "
            "wins over the configuration file, also after a restart, until reset. 422 names "
            "the field at fault; nothing changes."
        ),
        request=SettingsChange,
        parameters=(QUEUE_NAME,),
        response=QUEUE,
        problems=(401, 404, 422, 503),
    ),
    Route(
        "POST",
        "/v1/queues/{name}/reset",
        "operate",
        operate.reset_queue,
        "Remove every run-time override of a queue (the file's settings hold again)",
        parameters=(QUEUE_NAME,),
        response=QUEUE,
        problems=(401, 404, 503),
    ),
    Route(
        "GET",
        "/v1/schedules",
        "read",
        operate.list_schedules,
        "Schedules, last runs, missed periods, paused or not",
        response={
            "type": "object",
            "properties": {"schedules": {"type": "array", "items": SCHEDULE}},
        },
        problems=(401,),
    ),
    Route(
        "POST",
        "/v1/schedules/{name}/trigger",
        "operate",
        operate.trigger_schedule,
        "Create the run of one explicit period (idempotent); a dry run says whether it would "
        "create it",
        description=(
            "Works on a paused schedule too (an explicit request). `dry_run`: 200 with "
            "`outcome` `would_create` or `existing`, nothing created."
        ),
        parameters=(SCHEDULE_NAME,),
        request=TRIGGER_REQUEST,
        answers={
            "200": json_ok(RUN, "the run existed already (or the dry run's answer)"),
            "202": json_ok(RUN, "the run was created"),
        },
        problems=(400, 401, 404, 422, 503),
    ),
    Route(
        "POST",
        "/v1/schedules/{name}/catch-up",
        "operate",
        operate.catch_up_schedule,
        "Create the runs of every period in [from, to] that has none (idempotent); a dry run "
        "lists them and creates nothing",
        description=(
            "Missed periods (reasons not_fired, coalesced, disabled, paused) are never "
            "backfilled on their own; this is the explicit way. At most 1,000 periods per "
            "request; `to` may not lie in the future."
        ),
        parameters=(SCHEDULE_NAME,),
        request=CATCH_UP_REQUEST,
        answers={
            "200": json_ok(CATCH_UP, "nothing created (every run existed, or a dry run)"),
            "202": json_ok(CATCH_UP, "runs created"),
        },
        problems=(400, 401, 404, 422, 503),
    ),
    Route(
        "POST",
        "/v1/schedules/{name}/pause",
        "operate",
        operate.pause_schedule,
        "Pause a schedule on every daemon of this database (idempotent)",
        description=(
            "Persisted; holds across restarts. Its periods are recorded as missed with reason "
            "`paused` and never backfilled silently; explicit triggers and catch-up still "
            "work. Answers the schedule's status."
        ),
        parameters=(SCHEDULE_NAME,),
        response=SCHEDULE,
        problems=(401, 404, 503),
    ),
    Route(
        "POST",
        "/v1/schedules/{name}/resume",
        "operate",
        operate.resume_schedule,
        "Resume a paused schedule (idempotent)",
        description=(
            "The periods that passed while paused stay listed as missed (`paused`) for an "
            "explicit catch-up. Answers the schedule's status."
        ),
        parameters=(SCHEDULE_NAME,),
        response=SCHEDULE,
        problems=(401, 404, 503),
    ),
]

# public: no token; the separate metrics listener serves the first three too
PUBLIC_ROUTES = [
    Route("GET", "/healthz", None, health.healthz, "Alive", response=ANY_OBJECT),
    Route(
        "GET",
        "/readyz",
        None,
        health.readyz,
        "Database reachable, schema current, not draining",
        response=ANY_OBJECT,
        answers={"503": json_ok(ANY_OBJECT, "not ready")},
    ),
    Route(
        "GET",
        "/metrics",
        None,
        health.metrics_endpoint,
        "Prometheus metrics",
        answers={"200": {"description": "text exposition format"}},
    ),
    Route("GET", "/openapi.json", None, health.openapi, "This document", response=ANY_OBJECT),
]

ROUTES: list[Route] = [*JOB_ROUTES, *OPERATOR_ROUTES, *PUBLIC_ROUTES]
PUBLIC_PATHS = frozenset(r.path for r in PUBLIC_ROUTES)
