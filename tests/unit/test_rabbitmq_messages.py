"""The RabbitMQ transport's messages (relay/rabbitmq/messages.py): one job a message is the
previous releases' message, several travel in its body; how many a message carries and how many
messages a consumer holds; and the acknowledgements of a message of several jobs
(relay/rabbitmq/acks.py): one, once all its jobs are settled."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.relay.rabbitmq.acks import Acks
from dispatcher.relay.rabbitmq.messages import (
    JOBS_CONTENT_TYPE,
    carried,
    jobs_per_message,
    properties,
)


def test_a_message_of_one_job_is_the_previous_releases_message() -> None:
    body, props = properties(41, [(7, 2)])
    assert body == b""
    assert props.message_id == "41" and props.content_type is None
    assert props.headers == {"job_id": 7, "attempt": 2, "message": 41}
    assert carried(props.content_type, props.headers, body) == ([(7, 2)], 41)


def test_a_batch_message_carries_every_job_in_order_and_names_its_first_for_old_consumers() -> None:
    jobs = [(10**12 + i, i % 3) for i in range(150)]
    body, props = properties(10**15, jobs)
    assert props.content_type == JOBS_CONTENT_TYPE and len(body) == 12 * 150
    # what 1-job readers (earlier releases) use
    assert props.headers == {"job_id": 10**12, "attempt": 0, "message": 10**15}
    assert props.message_id == str(10**15)  # unique in flight: a broker's return finds its confirm
    assert carried(props.content_type, props.headers, body) == (jobs, 10**15)


def test_an_earlier_release_s_message_names_no_record() -> None:
    """Published by an earlier release's relay during a rolling upgrade: its jobs are claimed
    as ever, and no message record counts them."""
    headers = {"job_id": 7, "attempt": 2, "key": "key-7"}
    assert carried(None, headers, b"") == ([(7, 2)], None)


@pytest.mark.parametrize("record", ["41", 2**63, -(2**63) - 1, True, 4.0, None])
def test_a_message_header_that_names_no_record_leaves_the_jobs_to_run(record: object) -> None:
    """A `message` header this release did not write (a text, a number beyond bigint, another
    type) names no record: the jobs are claimed as an earlier release's, and no value reaches
    the claim that would fail it for every delivery gathered with this one."""
    headers = {"job_id": 7, "attempt": 2, "message": record}
    assert carried(None, headers, b"") == ([(7, 2)], None)
    body, props = properties(41, [(7, 2), (8, 0)])
    assert carried(props.content_type, {**(props.headers or {}), "message": record}, body) == (
        [(7, 2), (8, 0)],
        None,
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"job_id": 2**63, "attempt": 0},
        {"job_id": -(2**63) - 1, "attempt": 0},
        {"job_id": 7, "attempt": 2**31},
        {"job_id": 7, "attempt": -(2**31) - 1},
    ],
)
def test_a_job_or_attempt_beyond_its_column_is_not_a_relays_message(headers: dict) -> None:
    with pytest.raises(ValueError):
        carried(None, headers, b"")


@pytest.mark.parametrize("body", [b"", b"x" * 13])
def test_a_malformed_batch_message_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        carried(JOBS_CONTENT_TYPE, {"job_id": 1, "attempt": 0}, body)


def test_a_message_without_job_headers_is_refused() -> None:
    with pytest.raises(KeyError):
        carried(None, {}, b"")


@pytest.mark.parametrize("max_inflight", [1, 2, 10, 15, 16, 17, 100, 200, 300, 2000, 100_000])
@pytest.mark.parametrize("cap", [1, 50, 100, 1000])
def test_a_message_carries_at_most_a_sixteenth_of_its_queue_s_cap(
    max_inflight: int, cap: int
) -> None:
    """max_inflight is 16 messages' worth or more (the prefetch stays max_inflight messages: a
    prefetch of max_inflight // jobs_per_message held only 288 of 300 jobs in
    tests/e2e/test_crash_recovery.py)."""
    per_message = jobs_per_message(max_inflight, cap)
    assert 1 <= per_message <= cap
    assert per_message == 1 or per_message * 16 <= max_inflight
    if max_inflight >= 16 * cap:  # large queues: full messages
        assert per_message == cap


def test_the_bench_queue_carries_a_hundred_jobs_a_message() -> None:
    assert jobs_per_message(2000, 100) == 100
    assert jobs_per_message(200, 100) == 12
    assert jobs_per_message(15, 100) == 1  # the earlier releases' message


class Channel:
    """Records what Acks writes, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bool]] = []

    async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:
        self.sent.append(("ack", tag, multiple))

    async def basic_nack(self, tag: int, requeue: bool = True, wait: bool = True) -> None:
        self.sent.append(("nack", tag, requeue))


async def test_a_message_is_acked_once_with_its_last_job() -> None:
    channel = Channel()
    acks = Acks(channel)  # type: ignore[arg-type]
    acks.received(1, jobs=3)
    acks.received(2, jobs=1)
    acks.ack(1)
    acks.ack(2)  # settled, but behind tag 1, still open: alone
    acks.ack(1)
    await acks.settled()
    assert channel.sent == [("ack", 2, False)]
    acks.ack(1)  # the last job of message 1: now the front is settled
    await acks.settled()
    assert channel.sent == [("ack", 2, False), ("ack", 1, True)]


async def test_a_message_given_back_goes_at_once_and_its_running_jobs_ack_nothing() -> None:
    channel = Channel()
    acks = Acks(channel)  # type: ignore[arg-type]
    acks.received(5, jobs=4)
    acks.ack(5)  # a duplicate, say
    acks.give_back(5)  # the drain returns a held job: the whole message
    acks.give_back(5)  # another held job of it: nothing more
    await acks.settled()
    assert channel.sent == [("nack", 5, True)]
    acks.ack(5)  # a job of it that was running ends later
    acks.ack(5)
    await asyncio.sleep(0.01)
    await acks.settled()
    assert channel.sent == [("nack", 5, True)]
