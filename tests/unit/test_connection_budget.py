"""The connection budget's split (dispatcher/config/connection_budget.py): the parts add up to
exactly
`database_max_connections`, every pool keeps its minimum, explicit pool sizes are kept as given,
and a total below the minimum is refused naming it."""

from __future__ import annotations

import pytest

from dispatcher.config.connection_budget import DEDICATED, ConnectionBudget, minimum


@pytest.mark.parametrize("api", [None, 2, 10, 60])
@pytest.mark.parametrize("handlers", [None, 1, 10, 40])
def test_every_total_from_the_minimum_up_splits_exactly(
    api: int | None, handlers: int | None
) -> None:
    least = minimum(api=api, handlers=handlers)
    for total in range(least, 400):
        b = ConnectionBudget.split(total, api=api, handlers=handlers)
        assert b.api + b.handlers + b.engine + b.claims + sum(DEDICATED.values()) == total
        assert (b.api >= 2, b.handlers >= 1, b.engine >= 2, b.claims >= 1) == (True,) * 4
        assert b.least == least
        if api is not None:
            assert b.api == api
        if handlers is not None:
            assert b.handlers == handlers
    with pytest.raises(ValueError, match=f"set it to at least {least}"):
        ConnectionBudget.split(least - 1, api=api, handlers=handlers)


def test_the_default_and_what_the_daemon_says() -> None:
    assert ConnectionBudget.split(20).describe() == (
        "20 = api 4 + handlers 4 + engine 4 + claims 5 + wake-up listener 1 + lease heartbeat 1"
        " + liveness lock 1"
    )
    assert minimum() == 9
    assert DEDICATED == {"wake-up listener": 1, "lease heartbeat": 1, "liveness lock": 1}
