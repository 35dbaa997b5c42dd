"""Intake: what the doors accept (`requests`) and the durable, idempotent acceptance (`accept`)."""
