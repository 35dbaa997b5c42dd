"""The Python client of the dispatcher (docs/client.md).

- Over HTTP: `Client` (sync, standard library) and `AsyncClient` (aiohttp): enqueue one or many
  with idempotency keys, read, list, cancel, retry; 429/503 retried after `Retry-After`.
- Inside your own transaction (the SQL door): `enqueue` / `enqueue_many` (async: asyncpg,
  psycopg 3, SQLAlchemy async) and `enqueue_sync` / `enqueue_many_sync` (psycopg 3, SQLAlchemy).
- Receiving: `dispatcher.client.webhooks` verifies the Standard Webhooks signature of a
  delivery (aiohttp, FastAPI/Starlette, Flask).
"""

from dispatcher.client.http import (
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    Job,
    JobView,
    NotFound,
    Page,
    RetryPolicy,
    Unavailable,
)
from dispatcher.client.sql import (
    Enqueued,
    SqlJob,
    enqueue,
    enqueue_many,
    enqueue_many_sync,
    enqueue_sync,
)

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "Conflict",
    "Enqueued",
    "Job",
    "JobView",
    "NotFound",
    "Page",
    "RetryPolicy",
    "SqlJob",
    "Unavailable",
    "enqueue",
    "enqueue_many",
    "enqueue_many_sync",
    "enqueue_sync",
]
