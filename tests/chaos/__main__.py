"""`python -m tests.chaos --minutes N --transport inprocess|rabbitmq [--seed S] [--report FILE]`:
the chaos soak (docs/chaos.md). Prints the report; exit status 1 on any violation."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from tests.chaos.soak import Options, run_soak


def parse(argv: list[str]) -> tuple[Options, Path | None]:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, required=True, help="length of the chaos")
    parser.add_argument("--transport", choices=("inprocess", "rabbitmq"), default="inprocess")
    parser.add_argument("--seed", type=int, default=1, help="seeds the load and the faults")
    parser.add_argument("--report", type=Path, help="also write the report here, as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 24 * 60:
        parser.error(f"--minutes {args.minutes:g}: give a length between 0 and 1440 minutes")
    return Options(args.minutes, args.transport, args.seed, args.keep), args.report


def main(argv: list[str]) -> int:
    options, report_path = parse(argv)
    report = asyncio.run(run_soak(options))
    text = json.dumps(report, indent=2)
    print(text)
    if report_path is not None:
        report_path.write_text(text + "\n")
    violations = report.get("violations", [])
    print(f"chaos: {len(violations)} violations in {report.get('wall_s')} s", file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
