"""The RabbitMQ transport: an outbox relay that publishes ready jobs, and consumers that lease
what they receive. The database stays the authority on attempts, backoff and dead letters; the
broker only carries "job J is ready after attempt A".

- `RabbitLink` owns the connection: it connects (retrying with backoff while the broker is down,
  so the daemon starts and intake and the due-scan keep working), declares one durable quorum
  queue per dispatcher queue (idempotent), consumes them, and reconnects and re-declares when the
  broker closes the connection. `problem` names what is degraded, for /readyz.
- `OutboxRelay` leases a batch of outbox rows (SKIP LOCKED: any number of daemons relay side by
  side), publishes them all at once in messages of up to `jobs_per_message` ready jobs of a
  queue (persistent; what a message carries: `messages`), awaits their confirms together, then
  marks the confirmed messages' rows published. A crash or broker
  failure in between publishes them again later; the consumer's claim makes that harmless.
  The row stays until a consumer's claim starts its job, so the published rows of a queue are
  its messages not yet claimed: the relay keeps at most a window of them (`publish_ahead` x the
  queue's max_inflight, all daemons together) and picks what to publish fairly across tenants,
  so a tenant's burst waits in the database, not in the broker ahead of another tenant's job.
  Its sweep publishes again the rows published longer ago than `republish_after_s` whose jobs
  are still ready: messages lost in the broker (a purged queue, lost broker data). If such a
  message was only slow, one of its two deliveries is a counted duplicate.
- `RabbitTransport` hands the claim loop what was delivered: it leases the jobs in the database
  in batches (fenced by the attempt, within the queue's global limits), acks deliveries for jobs
  that are no longer ready for that attempt as counted duplicates, and acks a message only once
  each job it carries is settled: started and its attempt ended (its outcome committed), a
  duplicate, or refused. Prefetch is the queue's in-flight cap in messages: a daemon runs at
  most that many jobs, and what it holds unstarted is bounded by the relay's window. A delivery
  for a handler version this daemon cannot run (a mixed-version fleet during a rolling release)
  is never started here: the claim refuses it, writing the job a new outbox row that the relay
  publishes again after a second (to any daemon), and the delivery is acked. A requeue would not
  do: the broker hands a requeued message straight back to the same consumer, and a queue with a
  delivery limit would drop it; the database, not the broker, keeps the job ready.
- The drain (SIGTERM) cancels each queue's consumer as its claim loop stops and returns every
  message with a job held but not started (nack, requeue) at once (its jobs running or done are
  counted duplicates where it is delivered again); the other running attempts' messages are
  acked on the still-open channel when their outcomes commit.

Everything per message is kept small, and a message carries many jobs (`messages`), because
the per-message cost is the transport's cost
(measured with bench_scaleout, one daemon, 5,000 no-op jobs: aio-pika's Message objects and one
consumer task more per delivery cost ~360 us of daemon CPU per job before this module used the
underlying aiormq channel, which aio-pika exposes, for publishing, consuming and acknowledging).

Only this package imports aio_pika and aiormq: `link` (the connection and consumers),
`acks` (acknowledgements), `messages` (what a message carries), `publish` (batch publishing),
`outbox` (the relay) and `consume` (the transport the claim loops use).
"""

from dispatcher.relay.rabbitmq.consume import RabbitTransport
from dispatcher.relay.rabbitmq.link import RabbitLink
from dispatcher.relay.rabbitmq.outbox import OutboxRelay
from dispatcher.relay.rabbitmq.publish import batch_publishing, publish_batch

__all__ = ["OutboxRelay", "RabbitLink", "RabbitTransport", "batch_publishing", "publish_batch"]
