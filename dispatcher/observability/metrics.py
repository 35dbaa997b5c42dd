"""Every Prometheus metric the daemon exports (the only module that defines metric objects).

Labels are bounded: queue, outcome, reason, state, class. Never job ids or tenants.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from dispatcher import __version__

REGISTRY = CollectorRegistry(auto_describe=True)

# 1 ms ... 1 h: due-to-start and effect durations span both ends on the same dashboard.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
)

BUILD_INFO = Info("dispatcher_build", "Version of the running dispatcher.", registry=REGISTRY)
BUILD_INFO.info({"version": __version__})

JOBS_ACCEPTED = Counter(
    "dispatcher_jobs_accepted",
    "Jobs accepted by intake (new intents).",
    ["queue", "door"],
    registry=REGISTRY,
)
JOBS_COMPLETED = Counter(
    "dispatcher_jobs_completed",
    "Jobs that reached a terminal state.",
    ["queue", "outcome"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "dispatcher_retries",
    "Failed attempts scheduled for another try.",
    ["queue", "reason"],
    registry=REGISTRY,
)
SNOOZES = Counter(
    "dispatcher_snoozes",
    "Attempts whose handler asked to run again later without spending an attempt (Snooze).",
    ["queue"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "dispatcher_dead_letters",
    "Jobs moved to dead, by reason.",
    ["queue", "reason"],
    registry=REGISTRY,
)
DUPLICATE_DELIVERIES = Counter(
    "dispatcher_duplicate_deliveries",
    "Deliveries of jobs no longer ready, dropped without an effect.",
    ["queue"],
    registry=REGISTRY,
)
DELIVERIES_REFUSED = Counter(
    "dispatcher_deliveries_refused",
    "RabbitMQ deliveries of jobs for a handler version this process cannot run, handed back "
    "through the outbox for another daemon.",
    ["queue"],
    registry=REGISTRY,
)
OUTBOX_REPUBLISHED = Counter(
    "dispatcher_outbox_republished",
    "RabbitMQ messages published again by the relay's sweep: published longer ago than "
    "rabbitmq.republish_after_s and their jobs still ready and unclaimed (lost in the broker).",
    ["queue"],
    registry=REGISTRY,
)
BROKER_FAILURES = Counter(
    "dispatcher_broker_failures",
    "RabbitMQ connection attempts that failed, connections the broker closed, failed relay rounds.",
    registry=REGISTRY,
)
OUTCOMES_UNRECORDED = Counter(
    "dispatcher_outcomes_unrecorded",
    "Attempts whose outcome could not be written (database unavailable); retried after their"
    " lease expires.",
    ["queue"],
    registry=REGISTRY,
)
LEASES_LOST = Counter(
    "dispatcher_leases_lost",
    "Attempts whose result was not recorded because the lease had moved on.",
    ["queue"],
    registry=REGISTRY,
)
LEASES_RESCUED = Counter(
    "dispatcher_leases_rescued",
    "Expired leases rescued by the scan.",
    ["outcome"],
    registry=REGISTRY,
)
OWNER_GONE_RESCUED = Counter(
    "dispatcher_owner_gone_rescued",
    "Running jobs rescued before their lease expired because their daemon was gone (its "
    "liveness lock released: docs/recovery.md), by the state they went to.",
    ["outcome"],
    registry=REGISTRY,
)
LIVENESS_LOCK_HELD = Gauge(
    "dispatcher_liveness_lock_held",
    "1 while this daemon holds its liveness lock; 0 while it reconnects (others may then rescue "
    "its running jobs).",
    registry=REGISTRY,
)
JOBS_BY_STATE = Gauge(
    "dispatcher_jobs",
    "Jobs per state (sampled from the database).",
    ["queue", "state"],
    registry=REGISTRY,
)
READY_OLDEST_AGE = Gauge(
    "dispatcher_ready_oldest_age_seconds",
    "Age of the oldest ready, undelivered job per queue.",
    ["queue"],
    registry=REGISTRY,
)
OUTBOX_LAG = Gauge(
    "dispatcher_outbox_lag_seconds",
    "Age of the oldest outbox row (commit-to-publish gap).",
    registry=REGISTRY,
)
INFLIGHT = Gauge(
    "dispatcher_inflight", "Jobs running in this process.", ["queue"], registry=REGISTRY
)
DUE_TO_START = Histogram(
    "dispatcher_due_to_start_seconds",
    "Delay from a job's due time to the start of its attempt.",
    ["queue"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
EFFECT_DURATION = Histogram(
    "dispatcher_effect_duration_seconds",
    "Duration of one attempt.",
    ["queue"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
KEY_THROTTLED = Counter(
    "dispatcher_key_throttled_claims",
    "Claims in which a concurrency key at its limit held jobs back (per-key limits); per queue, "
    "never per key.",
    ["queue"],
    registry=REGISTRY,
)
LIMITER_WAIT = Counter(
    "dispatcher_limiter_wait_seconds",
    "Time the claim loop waited for start tokens.",
    ["queue"],
    registry=REGISTRY,
)
HTTP_RESPONSES = Counter(
    "dispatcher_http_responses",
    "Responses of HTTP targets by class.",
    ["queue", "class"],
    registry=REGISTRY,
)
SCAN_MOVED = Counter(
    "dispatcher_scan_moved", "Due jobs moved to ready by the scan.", registry=REGISTRY
)
CRON_RUNS = Counter(
    "dispatcher_cron_runs",
    "Cron run triggers by outcome (created, existing, skipped, queued, failed).",
    ["schedule", "outcome"],
    registry=REGISTRY,
)
CRON_MISSED = Counter(
    "dispatcher_cron_missed_periods",
    "Schedule periods that passed without a run and were not backfilled.",
    ["schedule"],
    registry=REGISTRY,
)
SCHEDULE_PAUSED = Gauge(
    "dispatcher_schedule_paused",
    "1 while an operator has paused the schedule (its periods are recorded missed), else 0.",
    ["schedule"],
    registry=REGISTRY,
)
OVERDUE = Gauge(
    "dispatcher_overdue_jobs",
    "Jobs due longer ago than overdue_after_s and not yet terminal.",
    ["queue"],
    registry=REGISTRY,
)
QUEUE_WINDOW_OPEN = Gauge(
    "dispatcher_queue_window_open",
    "1 while the queue may claim by its run windows (always, without windows), else 0: outside"
    " every window nothing is claimed; due jobs still become ready.",
    ["queue"],
    registry=REGISTRY,
)
QUEUE_PAUSED = Gauge(
    "dispatcher_queue_paused",
    "1 while an operator has paused the queue (nothing is claimed; intake and the due-scan go"
    " on), else 0.",
    ["queue"],
    registry=REGISTRY,
)
BULK_JOBS = Counter(
    "dispatcher_bulk_jobs",
    "Jobs looked at by operators' bulk actions (retry, cancel, discard, reschedule, run_now), by"
    " outcome: applied, skipped (a state the action does not apply to), busy (locked or moved"
    " on meanwhile).",
    ["action", "outcome"],
    registry=REGISTRY,
)
PRUNED = Counter(
    "dispatcher_pruned_jobs", "Terminal jobs deleted by retention.", ["state"], registry=REGISTRY
)
STATE_DIR_FREE = Gauge(
    "dispatcher_state_dir_free_bytes",
    "Free bytes on the filesystem of the state directory (embedded database only).",
    registry=REGISTRY,
)
STATE_DIR_RESERVE = Gauge(
    "dispatcher_state_dir_reserve_bytes",
    "Free space the embedded database keeps in reserve (state_dir_min_free_mb).",
    registry=REGISTRY,
)
STATE_DIR_LOW = Gauge(
    "dispatcher_state_dir_low_space",
    "1 while free space in the state directory is below the reserve: unready, intake 503.",
    registry=REGISTRY,
)
DATABASE_DISK_FULL = Counter(
    "dispatcher_database_disk_full",
    "Statements PostgreSQL refused because its disk is full (SQLSTATE 53100).",
    registry=REGISTRY,
)
AUTH_FAILURES = Counter(
    "dispatcher_auth_failures",
    "Wrong bearer tokens and console sign-ins (what: 'bearer token', 'console sign-in').",
    ["what"],
    registry=REGISTRY,
)
AUTH_REFUSED = Counter(
    "dispatcher_auth_refused",
    "Requests answered 429 because their address had too many failed authentications.",
    registry=REGISTRY,
)
