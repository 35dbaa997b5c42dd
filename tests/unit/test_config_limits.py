"""Limit groups in the configuration (issue 22 point 2): `[limit_groups.NAME]` and a queue's
`limit_group` and `group_priority`, from the file and from the environment; every mistake is one
line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.config.settings import load_settings
from tests.unit.test_config import config_error, write

SEED_001 = """
[limit_groups.background]
rate_per_s = 20
burst = 20
max_inflight = 10

[queues.notifications]
limit_group = "background"
group_priority = -10

[queues.cleanup]
limit_group = "background"
group_priority = 10
max_inflight = 2
"""


def test_queues_share_a_group_from_the_file(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, SEED_001), {})
    assert s.limit_groups["background"].limits() == (20.0, 20, 10)
    assert (s.queues["notifications"].limit_group, s.queues["notifications"].group_priority) == (
        "background",
        -10,
    )
    assert s.queues["cleanup"].group_priority == 10
    assert s.queues["default"].limit_group is None


def test_a_group_and_a_membership_from_the_environment() -> None:
    s = load_settings(
        None,
        {
            "DISPATCHER_LIMIT_GROUPS__PARTNER__MAX_INFLIGHT": "4",
            "DISPATCHER_QUEUES__DEFAULT__LIMIT_GROUP": "partner",
            "DISPATCHER_QUEUES__DEFAULT__GROUP_PRIORITY": "5",
        },
    )
    assert s.limit_groups["partner"].limits() == (None, None, 4)
    assert (s.queues["default"].limit_group, s.queues["default"].group_priority) == ("partner", 5)


def test_a_rate_without_a_burst_gets_one_seconds_worth() -> None:
    s = load_settings(None, {"DISPATCHER_LIMIT_GROUPS__G__RATE_PER_S": "7.5"})
    assert s.limit_groups["g"].limits() == (7.5, 8, None)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"DISPATCHER_QUEUES__DEFAULT__LIMIT_GROUP": "nope"},
            "limit_group 'nope' is not in [limit_groups] (none configured); add "
            "[limit_groups.nope]",
        ),
        ({"DISPATCHER_LIMIT_GROUPS__G__BURST": "5"}, "limits nothing"),
        (
            {
                "DISPATCHER_LIMIT_GROUPS__G__BURST": "5",
                "DISPATCHER_LIMIT_GROUPS__G__MAX_INFLIGHT": "3",
            },
            "has a burst but no rate_per_s",
        ),
        ({"DISPATCHER_LIMIT_GROUPS__G__RATE_PER_S": "0"}, "rate_per_s"),
        ({"DISPATCHER_LIMIT_GROUPS__BAD NAME__MAX_INFLIGHT": "3"}, "must match"),
        ({"DISPATCHER_QUEUES__DEFAULT__GROUP_PRIORITY": "101"}, "group_priority"),
        # past the database's columns: the registry write at start failed (a traceback)
        ({"DISPATCHER_QUEUES__DEFAULT__BURST": str(2**31)}, "burst"),
        ({"DISPATCHER_QUEUES__DEFAULT__RATE_PER_S": "1e12"}, "rate_per_s"),
        ({"DISPATCHER_QUEUES__DEFAULT__KEY_BURST": str(2**31)}, "key_burst"),
        (
            {
                "DISPATCHER_LIMIT_GROUPS__G__RATE_PER_S": "1",
                "DISPATCHER_LIMIT_GROUPS__G__BURST": str(2**31),
            },
            "burst",
        ),
        (
            {
                "DISPATCHER_LIMIT_GROUPS__G__MAX_INFLIGHT": "3",
                "DISPATCHER_LIMIT_GROUPS__G__RATE": "3",
            },
            "rate",
        ),
    ],
)
def test_mistakes_are_refused_naming_the_fix(env: dict[str, str], says: str) -> None:
    assert says in config_error(None, **env)
