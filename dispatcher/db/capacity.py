"""Whether the server has room for a daemon's connection budget, checked once at start.

The budget (`database_max_connections`) is what the daemon may open; the server's room is its
`max_connections` minus the slots reserved for superusers minus the client connections open
now. A daemon that starts without room reports ready while its claim loops cannot connect, and
takes the last slots other clients need: it is refused instead, in one line with the fix.

Two daemons starting at the same instant may each see room for one: the check is not a
reservation. Then the one that loses is not ready while its claims cannot get connections
(db/claims.py), and says so.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from dispatcher.config.connection_budget import ConnectionBudget
from dispatcher.db.queries import query
from dispatcher.errors import ServerCapacityError


class ServerConnections(NamedTuple):
    max_connections: int
    reserved: int
    in_use: int  # client connections, not counting the one asking

    @property
    def free(self) -> int:
        return self.max_connections - self.reserved - self.in_use


async def server_connections(conn: asyncpg.Connection) -> ServerConnections:
    row = await conn.fetchrow(query("server_connections"))
    assert row is not None
    return ServerConnections(row["max_connections"], row["reserved"], row["in_use"] - 1)


async def check_capacity(conn: asyncpg.Connection, budget: ConnectionBudget) -> None:
    """Raise ServerCapacityError when the budget does not fit the server's free slots."""
    server = await server_connections(conn)
    if budget.total <= server.free:
        return
    raise ServerCapacityError(
        f"database_max_connections = {budget.total} does not fit on the server: "
        f"max_connections {server.max_connections} - {server.reserved} reserved - "
        f"{server.in_use} in use = {max(server.free, 0)} free; lower "
        f"DISPATCHER_DATABASE_MAX_CONNECTIONS (at least {budget.least}), raise the server's "
        "max_connections, or close other clients' connections (docs/connections.md)"
    )
