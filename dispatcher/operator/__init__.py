"""Operator actions shared by the HTTP API, the console and the CLI."""
