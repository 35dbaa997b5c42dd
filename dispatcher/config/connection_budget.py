"""How one daemon's database connections (`database_max_connections`) are split.

A daemon opens at most `database_max_connections` connections, whatever the number of queues:

- dedicated, one each: the wake-up listener (LISTEN), the lease heartbeat, the liveness lock;
- `api`: intake and operator reads (`db_pool_size`, else a quarter of what is left);
- `handlers`: transactional handlers (`handler_pool_size`, else a quarter of what is left);
- the rest, shared by the engine: `engine` (completions, failures, the due-scan, cron, pruning,
  the RabbitMQ relay) takes half of it, at least 2, and `claims` the other half, at least 1:
  the connections every queue's claim loop borrows one claim at a time (db/claims.py).

Start-up commands (the first connection, the migration check) open one connection at a time,
before the pools, and close it: they never add to the total.
"""

from __future__ import annotations

from dataclasses import dataclass

# one connection each, held for the daemon's whole life
DEDICATED = {"wake-up listener": 1, "lease heartbeat": 1, "liveness lock": 1}
API_MIN = 2
HANDLERS_MIN = 1
ENGINE_MIN = 2
CLAIMS_MIN = 1


@dataclass(frozen=True)
class ConnectionBudget:
    """Pool sizes whose sum with the dedicated connections is exactly `total`."""

    total: int
    api: int
    handlers: int
    engine: int
    claims: int
    least: int  # the smallest total that holds the pool sizes set explicitly

    @classmethod
    def split(
        cls, total: int, *, api: int | None = None, handlers: int | None = None
    ) -> ConnectionBudget:
        """Derive the pools from `total`; `api` / `handlers` given are taken as they are.
        Raises ValueError naming the minimum when `total` cannot hold them."""
        needed = minimum(api=api, handlers=handlers)
        if total < needed:
            raise ValueError(
                f"database_max_connections = {total} is below the {needed} connections a daemon "
                f"needs ({_parts(api, handlers)}); set it to at least {needed} "
                "(DISPATCHER_DATABASE_MAX_CONNECTIONS)"
                + (", or lower db_pool_size / handler_pool_size" if api or handlers else "")
            )
        shared = total - sum(DEDICATED.values())
        floor = ENGINE_MIN + CLAIMS_MIN  # a derived share never eats into the engine's minimum
        if api is None:
            api = min(max(API_MIN, shared // 4), shared - floor - (handlers or HANDLERS_MIN))
        if handlers is None:
            handlers = min(max(HANDLERS_MIN, shared // 4), shared - floor - api)
        rest = shared - api - handlers
        engine = max(ENGINE_MIN, rest // 2)
        return cls(total, api, handlers, engine, rest - engine, needed)

    def describe(self) -> str:
        """`20 = api 4 + handlers 4 + engine 4 + claims 5 + wake-up listener 1 + ...`"""
        pools = {
            "api": self.api,
            "handlers": self.handlers,
            "engine": self.engine,
            "claims": self.claims,
        }
        parts = [f"{name} {n}" for name, n in (pools | DEDICATED).items()]
        return f"{self.total} = " + " + ".join(parts)


def minimum(*, api: int | None = None, handlers: int | None = None) -> int:
    """The smallest budget a daemon runs with, given the pool sizes set explicitly."""
    return (
        sum(DEDICATED.values())
        + (api if api is not None else API_MIN)
        + (handlers if handlers is not None else HANDLERS_MIN)
        + ENGINE_MIN
        + CLAIMS_MIN
    )


def _parts(api: int | None, handlers: int | None) -> str:
    sizes = {
        "api": api if api is not None else API_MIN,
        "handlers": handlers if handlers is not None else HANDLERS_MIN,
        "engine": ENGINE_MIN,
        "claims": CLAIMS_MIN,
    }
    return " + ".join(f"{name} {n}" for name, n in (sizes | DEDICATED).items())
