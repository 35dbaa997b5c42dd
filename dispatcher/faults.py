"""Named fault points for crash tests. Inert unless DISPATCHER_FAULT names one.

`DISPATCHER_FAULT=after_effect` makes the process SIGKILL itself the first time it passes that
point, so tests can prove each crash window of a job's life loses and duplicates nothing.
"""

from __future__ import annotations

import os
import signal

_ARMED = os.environ.get("DISPATCHER_FAULT", "")


def fault_point(name: str) -> None:
    if _ARMED and name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
