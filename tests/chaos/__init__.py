"""The chaos soak (issue 20): several daemons on a private PostgreSQL, a stream of jobs through
every door, faults injected at seeded random moments, and every invariant checked.

    python -m tests.chaos --minutes N --transport inprocess|rabbitmq [--seed S] [--report FILE]

docs/chaos.md describes the faults, each check and its bound.
"""
