"""The series names the daemon exposes, read from the registry in
`dispatcher.observability.metrics`.

A metric family exposes several series: a counter `x` as `x_total`, a histogram as `x_bucket`,
`x_count` and `x_sum`. Dashboards and alert rules name those series, so they are checked against
this set rather than against the family names.
"""

from __future__ import annotations

import re

from dispatcher.observability.metrics import REGISTRY

SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "info": ("_info",),
    "summary": ("", "_count", "_sum", "_created"),
}

# A metric name on its own, not part of a recording rule name such as `queue:dispatcher_x:rate5m`.
METRIC_REFERENCE = re.compile(r"(?<![\w:])dispatcher_[a-z0-9_]+(?![\w:])")


def exposed_series() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in SERIES_SUFFIXES[family.type])
    return names


def referenced_series(promql: str) -> set[str]:
    return set(METRIC_REFERENCE.findall(promql))
