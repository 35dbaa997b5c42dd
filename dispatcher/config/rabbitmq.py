"""The `[rabbitmq]` section: the RabbitMQ transport."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from dispatcher.config.base import MAX_DURATION_S, Strict, read_secret_lines


class RabbitSettings(Strict):
    """The RabbitMQ transport: one durable quorum queue per dispatcher queue, named
    `queue_prefix` + queue name; the URL's password is a secret (`url_file` reads it from a
    file: DISPATCHER_RABBITMQ__URL_FILE)."""

    url: SecretStr | None = None
    url_file: Path | None = None
    queue_prefix: str = Field("dispatcher.", max_length=200, pattern=r"^[A-Za-z0-9._:-]*$")
    relay_batch: int = Field(500, ge=1, le=10_000)
    # One message carries up to this many ready jobs of a queue (fewer when the queue's
    # max_inflight is small: relay/rabbitmq/messages.py), so the broker's and the daemon's cost
    # per message is paid once for many jobs. 1 publishes the previous releases' one-job
    # messages: the setting for a rolling release from one (a consumer of a previous release
    # starts only the first job of a larger message; the sweep publishes the others again).
    jobs_per_message: int = Field(100, ge=1, le=1000)
    # How long the relay waits for the broker to confirm a batch before giving its rows back to
    # be published again; and how often it releases the rows a consumer leased (a refused
    # delivery's) whose daemon died before releasing them.
    relay_lease_s: float = Field(30.0, gt=0, le=3600)
    reconnect_max_s: float = Field(10.0, gt=0, le=600)
    # The relay keeps at most this many times a queue's max_inflight of its messages published
    # and not yet claimed (all daemons together): what sits in the broker ahead of the consumers,
    # so one tenant's burst waits in the database, where the relay orders it fairly.
    publish_ahead: float = Field(2.0, ge=1, le=100)
    # A message published this long ago whose job is still ready and unclaimed was lost in the
    # broker (queue purged, broker data lost): the relay's sweep publishes it again (its record
    # in outbox_messages is kept until a claim handled its jobs, or this long: migration 054).
    republish_after_s: float = Field(300.0, ge=1, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _one_url(self) -> RabbitSettings:
        if self.url is not None and self.url_file is not None:
            raise ValueError("set rabbitmq.url or rabbitmq.url_file, not both")
        if self.url is not None and not self.url.get_secret_value().startswith(
            ("amqp://", "amqps://")
        ):
            raise ValueError("rabbitmq.url must start with amqp:// or amqps://")
        return self

    def resolved_url(self) -> str | None:
        if self.url is not None:
            return self.url.get_secret_value()
        if self.url_file is not None:
            lines = read_secret_lines(self.url_file, "rabbitmq.url_file")
            return lines[0] if lines else None
        return None
