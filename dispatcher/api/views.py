"""How the API shows a job, a job in a list, an attempt and an accepted job (the CLI prints
the same views)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispatcher.core import rfc3339
from dispatcher.core.redact import masked_target
from dispatcher.model import EnqueueResult


def accepted_view(result: EnqueueResult) -> dict[str, Any]:
    if result.due_at is None or result.created_at is None:  # pruned: only the ledger remains
        return {
            "id": result.id,
            "key": result.key,
            "state": result.state,
            "pruned": True,
            "detail": f"job {result.id} ended {result.state} and was pruned; its key is kept "
            "for retention.keys_s, so the same request is not run again",
        }
    return {
        "id": result.id,
        "key": result.key,
        "state": result.state,
        "due_at": rfc3339.format(result.due_at),
        "created_at": rfc3339.format(result.created_at),
    }


def _ts(value: datetime | None) -> str | None:
    return rfc3339.format(value) if value else None


def summary_view(row: dict[str, Any]) -> dict[str, Any]:
    """A job in a list: what `JobRepository.list_summaries` reads (`last_error` cut short)."""
    return {
        "id": row["id"],
        "key": row["key"],
        "state": row["state"],
        "queue": row["queue"],
        "tenant": row["tenant"] or None,
        "handler": row["handler"],
        "attempt": row["attempt"],
        "due_at": _ts(row["due_at"]),
        "created_at": _ts(row["created_at"]),
        "started_at": _ts(row["started_at"]),
        "finished_at": _ts(row["finished_at"]),
        "last_error": row["last_error"],
        "dead_reason": row["dead_reason"],
        "run_key": row["run_key"],
        "priority": row["priority"],
        "concurrency_key": row["concurrency_key"],
    }


def job_view(row: dict[str, Any]) -> dict[str, Any]:
    """The status resource: the list view's fields plus what only one job's page shows."""
    return {
        **summary_view(row),
        "handler_version": row["handler_version"],
        # a URL that is no text (the SQL door stores a target as given) is shown as none
        "target_url": row.get("target_url"),
        "max_attempts": row["max_attempts"],
        "max_retry_age_s": row["max_retry_age_s"],
        "cancel_requested": row["cancel_requested"],
        "result": row["result"],
        "progress": row["progress"],
        # a dead-letter notification: the id of the job whose death it reports
        "dead_letter_of": row.get("dead_letter_of"),
        **contract_view(row),
    }


def contract_view(row: dict[str, Any]) -> dict[str, Any]:
    """A job's contract (docs/guides/intake-contracts.md): its deadline, its time to live, its
    callback targets (masked as the console masks a target: header values and URL secrets are
    never shown) and what key modes did to it (`replaced`: None while no request replaced it)."""
    replaced = None
    if row.get("replacements"):
        replaced = {
            "on_key": row["replaced_by"],
            "times": row["replacements"],
            "last_at": _ts(row["replaced_at"]),
            # the latest due time the last replacement's debounce_max_s allows (None: no bound)
            "due_at_bound": _ts(row["debounce_until"]),
        }
    return {
        "timeout_s": row.get("timeout_s"),
        "expires_at": _ts(row.get("expires_at")),
        "on_success": masked_target(row.get("on_success")),
        "on_failure": masked_target(row.get("on_failure")),
        "replaced": replaced,
    }


def attempt_view(row: dict[str, Any]) -> dict[str, Any]:
    """One row of a job's attempt history (`JobRepository.attempts`)."""
    return {
        "attempt": row["attempt"],
        "outcome": row["outcome"],
        "reason": row["reason"],
        "owner": row["owner"],
        "started_at": _ts(row["started_at"]),
        "finished_at": _ts(row["finished_at"]),
        "http_status": row["http_status"],
        "latency_s": row["latency_s"],
        "excerpt": row["excerpt"],
    }
