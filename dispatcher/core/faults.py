"""Named fault points for crash tests. Inert unless DISPATCHER_FAULT names one.

`DISPATCHER_FAULT=after_effect` makes the process SIGKILL itself the first time it passes that
point, so tests can prove each crash window of a job's life loses and duplicates nothing.
`DISPATCHER_FAULT=raise:claim_loop:default` makes that point raise `FaultInjected` instead (a
bug in a background loop), so tests can prove the supervisor turns it into a restart.
"""

from __future__ import annotations

import os
import signal

from dispatcher.errors import DispatcherError

_ARMED = os.environ.get("DISPATCHER_FAULT", "")


class FaultInjected(DispatcherError):
    """Raised at an armed `raise:` fault point."""


def fault_point(name: str) -> None:
    if not _ARMED:
        return
    if name == _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
    elif "raise:" + name == _ARMED:
        raise FaultInjected(f"fault point {name} (DISPATCHER_FAULT={_ARMED})")
