"""The Grafana dashboard: well-formed, laid out without overlaps, and every query names a series
the daemon exports (and parses as PromQL, when promtool is here to say so)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.metric_names import exposed_series, referenced_series

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "grafana" / "dispatcher-dashboard.json"
GRID_WIDTH = 24

# What an operator opens the dashboard for, as the series that show it.
REQUIRED_SERIES = {
    "dispatcher_jobs",  # jobs by state
    "dispatcher_ready_oldest_age_seconds",
    "dispatcher_due_to_start_seconds_bucket",
    "dispatcher_jobs_completed_total",  # throughput by outcome
    "dispatcher_retries_total",
    "dispatcher_dead_letters_total",
    "dispatcher_inflight",
    "dispatcher_outbox_lag_seconds",
}

# Grafana's variables, replaced by something PromQL accepts.
VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$queue": ".*"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # inside collapsed rows


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def test_dashboard_is_current_and_uses_the_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_queries_name_only_exported_series(dashboard: dict[str, Any]) -> None:
    exported = exposed_series()
    for expr in expressions(dashboard):
        named = referenced_series(expr)
        assert named, f"no dispatcher metric in {expr}"
        assert named <= exported, (
            f"{sorted(named - exported)} not in dispatcher/observability/metrics.py"
        )


def test_dashboard_shows_what_operators_need(dashboard: dict[str, Any]) -> None:
    shown = set().union(*(referenced_series(e) for e in expressions(dashboard)))
    assert REQUIRED_SERIES - shown == set()
    due_to_start = [e for e in expressions(dashboard) if "due_to_start_seconds_bucket" in e]
    for quantile in ("0.5", "0.95", "0.99"):
        assert any(e.startswith(f"histogram_quantile({quantile},") for e in due_to_start)


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is absent: apt-get install prometheus"
)
def test_queries_parse_as_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    rules = []
    for number, expr in enumerate(expressions(dashboard)):
        for variable, value in VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{number}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"  # JSON is YAML: no YAML library needed
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
