"""The intake contracts' settings: the key ledger's window outlives every job retention, and
what the configuration enqueues itself obeys limits.max_payload_bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatcher.config.settings import Settings, load_settings
from dispatcher.core.payload_size import oversize
from dispatcher.errors import ConfigError


def test_defaults() -> None:
    s = Settings()
    assert s.retention.keys_s == 90 * 86400
    assert s.limits.max_payload_bytes == 256 * 1024


def test_a_key_window_not_longer_than_a_job_retention_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dispatcher.toml"
    path.write_text("[retention]\nsucceeded_s = 8640000\nkeys_s = 8640000\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    message = str(caught.value)
    assert "keys_s (8640000) must be longer than every job retention" in message
    assert "succeeded_s is 8640000" in message
    path.write_text("[retention]\nsucceeded_s = 8640000\nkeys_s = 8640001\n")
    assert load_settings(path, environ={}).retention.keys_s == 8640001


def test_a_schedule_over_the_payload_limit_is_refused() -> None:
    schedule = {
        "name": "nightly",
        "cron": "0 3 * * *",
        "handler": "http",
        "target": {"url": "https://a.example/", "headers": {"x-pad": "y" * 3000}},
    }
    with pytest.raises(ValueError, match=r"schedule 'nightly': params and target are 30\d\d "):
        Settings.model_validate({"limits": {"max_payload_bytes": 2048}, "schedules": [schedule]})
    Settings.model_validate({"limits": {"max_payload_bytes": 4096}, "schedules": [schedule]})


@pytest.mark.parametrize(
    "value",
    [{}, {"a": [1, 2, {"b": "x,y: z"}], "c": None, "d": True}, {"k": [[], {}], "s": 'é\n"\\'}],
)
def test_the_size_is_the_text_jsonb_renders(value: dict[str, object]) -> None:
    rendered = len(json.dumps(value, ensure_ascii=False).encode())  # jsonb's spacing
    assert oversize(value, None, rendered) is None
    assert oversize(value, None, rendered - 1) == rendered
    assert oversize(value, {"url": "u"}, rendered) == rendered + len('{"url": "u"}')


def test_the_http_client_sends_the_key_mode() -> None:
    from dispatcher.client.http import Job, batch_call, enqueue_call

    job = Job("k", "report", {"n": 1}, on_key="replace", debounce_max_s=30)
    assert enqueue_call(job).body == {
        "handler": "report",
        "payload": {"n": 1},
        "on_key": "replace",
        "debounce_max_s": 30,
    }
    (item,) = batch_call([Job("k", "report", on_key="keep_due")]).body["jobs"]
    assert item["on_key"] == "keep_due" and "debounce_max_s" not in item
