"""What one broker message carries: one ready job (the previous releases' message) or many.

A message of one job is the previous releases' message: no body, the job id and attempt in its
headers. A message of several jobs (a *batch message*) carries their (job id, attempt) pairs in
its body, packed (`<qi` each: 12 bytes a job), with the content type `JOBS_CONTENT_TYPE`. Either
names the record its relay wrote of it (outbox_messages, migration 054) in its `message` header
and as its message_id (unique among messages in flight, as a broker's return needs); the claim
that handles its jobs counts them there. Its headers still name its first job, so a consumer of a
previous release that receives one during a rolling release starts that job and acknowledges
the message: the others' rows stay published and unclaimed, and the relay's sweep publishes
them again after `republish_after_s` (nothing is lost; set `rabbitmq.jobs_per_message` to 1
until every daemon runs this release to avoid that delay).

Per-message work is most of the transport's cost in the daemon (bench_scaleout, one daemon:
~60 us of CPU per job over RabbitMQ against ~6 in process, a third of it aiormq parsing each
delivery's frames, a sixth marshalling publishes), and each message costs the same whatever it
carries: a batch message of 100 jobs pays it once for all of them.

How many messages a consumer may hold unacknowledged stays the queue's max_inflight, as when a
message carried one job: a message is acknowledged once every job it carries has ended (or was
a duplicate or refused), so a prefetch of fewer messages would cap the jobs a daemon runs at
once whenever messages are not full (a low rate, the tail of a lease: one job a message at
worst), and it did (tests/e2e/test_crash_recovery.py runs 300 at once in one daemon; prefetch
300 // 18 messages of up to 18 jobs held 288). So what bounds the jobs a daemon holds unstarted
is the relay's window: at most `publish_ahead` x max_inflight jobs of a queue are published and
not yet claimed, all daemons together; the jobs it runs stay bounded by max_inflight. A message
carries at most max_inflight // `MESSAGES_PER_CAP` jobs (at least one), so a queue's window is
at least that many messages, shared among its consumers, and a message whose last job is slow
holds only its own jobs' place: a queue of 2,000 in flight carries the full 100 a message, of
200 it carries 12, of 15 or fewer one (the earlier releases' messages).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from pamqp.commands import Basic
from pamqp.common import FieldTable

JOBS_CONTENT_TYPE = "application/x.dispatcher.jobs"
_PAIR = struct.Struct("<qi")  # job id, the attempt it is ready after
MESSAGES_PER_CAP = 16


def jobs_per_message(max_inflight: int, cap: int) -> int:
    """The jobs one message of a queue carries at most: `cap` (rabbitmq.jobs_per_message), less
    when the queue's max_inflight would be fewer than MESSAGES_PER_CAP full messages."""
    return max(1, min(cap, max_inflight // MESSAGES_PER_CAP))


def properties(message: int, jobs: Sequence[tuple[int, int]]) -> tuple[bytes, Basic.Properties]:
    """The body and properties of message `message` carrying `jobs` ((job id, attempt) each,
    in the order to start them)."""
    job_id, attempt = jobs[0]
    headers: FieldTable = {"job_id": job_id, "attempt": attempt, "message": message}
    # message_id: unique among messages in flight, so a broker's return finds its confirm
    if len(jobs) == 1:  # the previous releases' message: all it carries is in its properties
        return b"", Basic.Properties(delivery_mode=2, message_id=str(message), headers=headers)
    body = b"".join([_PAIR.pack(j, a) for j, a in jobs])
    return body, Basic.Properties(
        delivery_mode=2,  # persistent
        message_id=str(message),
        content_type=JOBS_CONTENT_TYPE,
        headers=headers,
    )


_BIGINT = range(-(2**63), 2**63)
_INTEGER = range(-(2**31), 2**31)


def carried(
    content_type: str | None, headers: FieldTable | None, body: bytes
) -> tuple[list[tuple[int, int]], int | None]:
    """The (job id, attempt) pairs a delivered message carries, and the record of it (None: an
    earlier release's message, or a `message` header that names none); ValueError (or
    KeyError, TypeError) when it is not a relay's message. Each value is checked against the
    column it is claimed with: one delivery's id beyond bigint failed the claim of every
    delivery gathered with it, again at each retry."""
    headers = headers or {}
    message = headers.get("message")
    record = message if type(message) is int and message in _BIGINT else None
    if content_type == JOBS_CONTENT_TYPE:
        if not body or len(body) % _PAIR.size:
            raise ValueError(f"a batch message of {len(body)} bytes")
        return list(_PAIR.iter_unpack(body)), record  # `<qi`: bigint and integer by size
    job_id, attempt = int(headers["job_id"]), int(headers["attempt"])  # type: ignore[arg-type]
    if job_id not in _BIGINT or attempt not in _INTEGER:
        raise ValueError(f"job {job_id}, attempt {attempt}: out of range")
    return [(job_id, attempt)], record
