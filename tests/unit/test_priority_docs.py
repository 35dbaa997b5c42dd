"""docs/guides/priorities-and-fairness.md: the seed 001 configuration on the page loads, and its
cleanup units run at priority 50 beside the default queue's other work."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from dispatcher.config.settings import load_settings
from tests.docs_blocks import ROOT, blocks

PAGE = ROOT / "docs" / "guides" / "priorities-and-fairness.md"


def test_the_seed_001_example_loads_with_the_cleanup_at_low_priority(tmp_path: Path) -> None:
    (block,) = [b for b in blocks(PAGE) if b.language == "toml"]
    assert block.marker == ("tested-by", "tests/unit/test_priority_docs.py")
    config = tmp_path / "dispatcher.toml"
    config.write_text(block.text)
    settings = load_settings(config, environ={})
    (schedule,) = settings.schedules
    assert (schedule.queue, schedule.priority) == ("default", 50)
    period = datetime(2026, 6, 1, 1, 15, tzinfo=UTC)
    (unit,) = schedule.jobs_for(period, schedule.static_units() or [])
    assert (unit.queue, unit.priority) == ("default", 50)
