"""dispatcher: a durable delayed-job dispatcher for PostgreSQL."""

__version__ = "0.1.0"
