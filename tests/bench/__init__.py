"""Benchmarks: run as scripts (`python -m tests.bench.<name>`), never collected by pytest."""
