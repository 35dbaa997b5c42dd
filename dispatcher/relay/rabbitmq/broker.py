"""One daemon's side of the RabbitMQ transport, built from the settings: the link, the outbox
relay and the transport the claim loops consume through."""

from __future__ import annotations

from dispatcher.config.settings import Settings
from dispatcher.db.claims import ClaimConnections
from dispatcher.db.relay import RelayRepository
from dispatcher.relay.rabbitmq.consume import RabbitTransport
from dispatcher.relay.rabbitmq.link import RabbitLink
from dispatcher.relay.rabbitmq.outbox import OutboxRelay
from dispatcher.runtime.lifecycle import Service


class Broker:
    def __init__(
        self,
        settings: Settings,
        relays: RelayRepository,
        claims: ClaimConnections,
        *,
        owner: str,
        capabilities: list[str],
    ):
        s = settings
        url = s.rabbitmq.resolved_url()
        assert url is not None  # the settings refuse rabbitmq without a URL
        self.link = RabbitLink(
            url,
            s.rabbitmq.queue_prefix,
            {q: qs.max_inflight for q, qs in s.queues.items()},
            reconnect_max_s=s.rabbitmq.reconnect_max_s,
            jobs_per_message=s.rabbitmq.jobs_per_message,
        )
        self.relay = OutboxRelay(
            relays,
            self.link,
            owner=owner,
            batch=s.rabbitmq.relay_batch,
            confirm_timeout_s=s.rabbitmq.relay_lease_s,
            publish_ahead=s.rabbitmq.publish_ahead,
            republish_after_s=s.rabbitmq.republish_after_s,
        )
        self.transport = RabbitTransport(
            claims,
            self.link,
            owner=owner,
            capabilities=capabilities,
            lease_s=s.lease_s,
            wait_s=s.scan_interval_s,
        )

    @property
    def services(self) -> list[Service]:
        """Up before the consumers, down after them: the link, then the relay."""
        return [self.link, self.relay]

    async def retune(self, queue: str, max_inflight: int) -> None:
        """A max_inflight changed at run time: the publish window and the prefetch follow."""
        self.relay.set_max_inflight(queue, max_inflight)
        await self.link.set_prefetch(queue, max_inflight)
