"""`dispatcher config example`: the shipped files are the repository's config/ and systemd/,
printed byte for byte; an unknown name is refused with the list of names and prints nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_config_example_prints_the_annotated_settings_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "example"]) == 0
    assert capsys.readouterr().out == (ROOT / "config/dispatcher.toml").read_text()


def test_config_example_names_every_shipped_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "example", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    expected = [str(p.relative_to(ROOT / "config")) for p in (ROOT / "config").rglob("*.*")]
    expected += [f"systemd/{p.name}" for p in (ROOT / "systemd").iterdir()]
    assert sorted(listed) == sorted(expected)
    assert main(["config", "example", "systemd/dispatcher.service"]) == 0
    assert capsys.readouterr().out == (ROOT / "systemd/dispatcher.service").read_text()


def test_an_unknown_example_is_refused_with_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "example", "nginx.conf"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "no shipped example named 'nginx.conf'" in err and "dispatcher.toml" in err
