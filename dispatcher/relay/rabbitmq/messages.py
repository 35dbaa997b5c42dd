"""What one broker message carries: one ready job (the previous releases' message) or many.

A message of one job is exactly the previous releases' message: no body, message_id = the job's
key, the job id, attempt and key in its headers. A message of several jobs (a *batch message*)
carries their (job id, attempt) pairs in its body, packed (`<qi` each: 12 bytes a job), with the
content type `JOBS_CONTENT_TYPE`; its headers still name its first job, so a consumer of a
previous release that receives one during a rolling release starts that job and acknowledges
the message: the others' rows stay published and unclaimed, and the relay's sweep publishes
them again after `republish_after_s` (nothing is lost; set `rabbitmq.jobs_per_message` to 1
until every daemon runs this release to avoid that delay).

Per-message work is most of the transport's cost in the daemon (bench_scaleout, one daemon:
~60 us of CPU per job over RabbitMQ against ~6 in process, a third of it aiormq parsing each
delivery's frames, a sixth marshalling publishes), and each message costs the same whatever it
carries: a batch message of 100 jobs pays it once for all of them.

How many jobs a message carries, and how many messages a consumer may hold unacknowledged, are
derived together from the queue's max_inflight, so that a daemon never holds more jobs than it
may run at once (the prefetch of the previous releases, one job a message, was max_inflight):
a message is acknowledged once every job it started has ended, so a message whose last job is
slow keeps its place and the jobs it carried are held in that place meanwhile: at least
`MIN_MESSAGES_HELD` messages (while max_inflight allows: a queue of 200 in flight carries 12
jobs a message, of 2,000 the full 100) keep a few slow jobs from holding up a daemon's queue.
A queue of long jobs of very uneven length runs best with `jobs_per_message = 1`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from pamqp.commands import Basic
from pamqp.common import FieldTable

JOBS_CONTENT_TYPE = "application/x.dispatcher.jobs"
_PAIR = struct.Struct("<qi")  # job id, the attempt it is ready after
MIN_MESSAGES_HELD = 16


def jobs_per_message(max_inflight: int, cap: int) -> int:
    """The jobs one message of a queue carries at most: `cap` (rabbitmq.jobs_per_message), less
    when the queue's max_inflight would leave fewer than MIN_MESSAGES_HELD messages held."""
    return max(1, min(cap, max_inflight // MIN_MESSAGES_HELD))


def message_prefetch(max_inflight: int, cap: int) -> int:
    """The messages a consumer of the queue may hold unacknowledged: as many as hold at most
    max_inflight jobs (at least one)."""
    return max(1, max_inflight // jobs_per_message(max_inflight, cap))


def properties(jobs: Sequence[tuple[int, int, str]]) -> tuple[bytes, Basic.Properties]:
    """The body and properties of the message carrying `jobs` ((job id, attempt, key) each, in
    the order to start them)."""
    job_id, attempt, key = jobs[0]
    headers: FieldTable = {"job_id": job_id, "attempt": attempt, "key": key}
    if len(jobs) == 1:  # the previous releases' message: all it carries is in its properties
        return b"", Basic.Properties(delivery_mode=2, message_id=key, headers=headers)
    body = b"".join([_PAIR.pack(j, a) for j, a, _ in jobs])
    return body, Basic.Properties(
        delivery_mode=2,  # persistent
        message_id=key,  # unique among messages in flight: a broker's return finds its confirm
        content_type=JOBS_CONTENT_TYPE,
        headers=headers,
    )


def carried(
    content_type: str | None, headers: FieldTable | None, body: bytes
) -> list[tuple[int, int]]:
    """The (job id, attempt) pairs a delivered message carries; ValueError (or KeyError,
    TypeError) when it is not a relay's message."""
    if content_type == JOBS_CONTENT_TYPE:
        if not body or len(body) % _PAIR.size:
            raise ValueError(f"a batch message of {len(body)} bytes")
        return list(_PAIR.iter_unpack(body))
    headers = headers or {}
    return [(int(headers["job_id"]), int(headers["attempt"]))]  # type: ignore[arg-type]
