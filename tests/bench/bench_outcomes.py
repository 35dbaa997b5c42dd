"""What the safe forms of outcomes (dispatcher/db/outcomes.py) cost per completion: `result_json`
(what a completion stores) against `jsoncodec.dumps` (what it stored before issue 20), and
`storable_text` for an excerpt or error text. Pure CPU, no database; best of 5 runs each.

    .venv/bin/python -m tests.bench.bench_outcomes
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from typing import Any

from dispatcher.core import jsoncodec
from dispatcher.db.outcomes import result_json, storable_text
from tests.bench.common import environment_only

RESULTS: dict[str, Any] = {
    "http summary {'status': 200}": {"status": 200},
    "3-key dict": {"recorded": "lease-4831:revoke-upload-grants:2026-05-31", "n": 3, "ok": True},
    "dict holding None (walked)": {"a": None, "b": 1},
    "1,000 ints": list(range(1000)),
    "1,000 small dicts": [{"i": i} for i in range(1000)],
    "text with NUL (walked)": "a\x00b",
}


def best_us(call: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6


def main() -> None:
    print(f"{'result':42} {'result_json':>12} {'dumps before':>12}")
    for name, value in RESULTS.items():
        number = 200 if isinstance(value, list) else 20_000
        new = best_us(lambda v=value: result_json(v), number)  # type: ignore[misc]
        old = best_us(lambda v=value: jsoncodec.dumps(v), number)  # type: ignore[misc]
        print(f"{name:42} {new:9.2f} µs {old:9.2f} µs")
    for name, text in {"short excerpt": "ok", "500 non-ASCII": "é" * 500}.items():
        cost = best_us(lambda t=text: storable_text(t, 500), 20_000)  # type: ignore[misc]
        print(f"storable_text, {name:27} {cost:9.2f} µs")


if __name__ == "__main__":
    environment_only(__doc__)
    main()
