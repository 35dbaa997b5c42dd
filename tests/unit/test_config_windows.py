"""Run windows in the configuration: read from the file and the environment (where windows
split at ';', since a window's days may be a comma list), a bad one refused naming the setting
and the part of the window that is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.config.settings import load_settings
from dispatcher.errors import ConfigError

SEED_001 = ["Mon-Fri 18:00-07:00 Europe/Berlin", "Sat,Sun 00:00-24:00 Europe/Berlin"]


def test_windows_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text(f"[queues.cleanup]\nwindows = {SEED_001!r}\n".replace("'", '"'))
    assert load_settings(path, {}).queues["cleanup"].windows == SEED_001
    assert load_settings(None, {}).queues["default"].windows == []


def test_windows_from_the_environment_split_at_semicolons() -> None:
    env = {"DISPATCHER_QUEUES__CLEANUP__WINDOWS": " ; ".join(SEED_001)}
    assert load_settings(None, env).queues["cleanup"].windows == SEED_001


def test_a_bad_window_names_the_setting_and_the_part(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text('[queues.cleanup]\nwindows = ["Mon-Fri 18:00-07:00 Europe/Berln"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, {})
    message = str(caught.value)
    assert "queues.cleanup.windows" in message
    assert "'Europe/Berln' is not a known IANA name" in message
