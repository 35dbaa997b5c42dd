"""The RabbitMQ relay's window and sweep settings: defaults, environment overrides, and a bad
value refused with one line naming the setting and what is allowed."""

from __future__ import annotations

import pytest

from dispatcher.config.settings import load_settings
from dispatcher.errors import ConfigError

BROKER = {"DISPATCHER_TRANSPORT": "rabbitmq", "DISPATCHER_RABBITMQ__URL": "amqp://g:p@h/"}


def test_defaults_keep_two_in_flight_caps_ahead_and_sweep_after_five_minutes() -> None:
    r = load_settings(None, BROKER).rabbitmq
    assert r.publish_ahead == 2.0
    assert r.republish_after_s == 300.0


def test_both_are_read_from_the_environment() -> None:
    r = load_settings(
        None,
        {
            **BROKER,
            "DISPATCHER_RABBITMQ__PUBLISH_AHEAD": "1.5",
            "DISPATCHER_RABBITMQ__REPUBLISH_AFTER_S": "120",
        },
    ).rabbitmq
    assert (r.publish_ahead, r.republish_after_s) == (1.5, 120.0)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("PUBLISH_AHEAD", "0.5", "greater than or equal to 1"),
        ("PUBLISH_AHEAD", "1000", "less than or equal to 100"),
        ("REPUBLISH_AFTER_S", "0", "greater than or equal to 1"),
        ("REPUBLISH_AFTER_S", "soon", "valid number"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(name: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(None, {**BROKER, f"DISPATCHER_RABBITMQ__{name}": value})
    message = str(raised.value)
    assert f"rabbitmq.{name.lower()}" in message and allowed in message, message
