"""Which driver errors the repositories translate into `DatabaseUnavailable` (503 with
Retry-After at the API) and which stay errors of the request."""

from __future__ import annotations

import asyncpg
import pytest

from dispatcher.db.pool import RECONNECT_ERRORS, is_unavailable, translate_unavailable
from dispatcher.errors import DatabaseUnavailable

# The error the chaos soak met after a PostgreSQL restart: the statement had returned, and the
# pool's hand-back of the cut connection failed; the API answered 500 instead of 503.
BROKEN_PROTOCOL = asyncpg.InternalClientError(
    "cannot switch to state 12; another operation (2) is in progress"
)


@pytest.mark.parametrize(
    "exc",
    [
        BROKEN_PROTOCOL,
        ConnectionResetError("reset by peer"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.TooManyConnectionsError("too many clients"),
    ],
    ids=["broken-protocol", "reset", "closed", "too-many"],
)
def test_an_outage_is_unavailable(exc: BaseException) -> None:
    assert is_unavailable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.InterfaceError("the server expects 2 arguments, 1 was passed"),
        asyncpg.UniqueViolationError("duplicate key"),
    ],
    ids=["bad-arguments", "unique"],
)
def test_a_wrong_request_is_not(exc: BaseException) -> None:
    assert not is_unavailable(exc)


async def test_a_broken_protocol_leaves_a_repository_as_unavailable() -> None:
    @translate_unavailable
    async def read() -> None:
        raise BROKEN_PROTOCOL

    with pytest.raises(DatabaseUnavailable, match="another operation"):
        await read()


@pytest.mark.parametrize(
    "exc",
    [BROKEN_PROTOCOL, ConnectionResetError("reset"), asyncpg.InterfaceError("closed")],
    ids=["broken-protocol", "reset", "closed"],
)
def test_services_with_a_connection_of_their_own_reconnect_on_it(exc: BaseException) -> None:
    """The wake-up listener and the liveness lock catch RECONNECT_ERRORS and reconnect; one
    they let through kills the service, and a dead service stops the daemon (exit 1)."""
    assert isinstance(exc, RECONNECT_ERRORS)
