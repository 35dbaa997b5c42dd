"""Moving ready jobs from the outbox to the workers (the transport)."""
