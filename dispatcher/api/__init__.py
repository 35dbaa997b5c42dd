"""The HTTP API (aiohttp): intake, status, operator actions, health, metrics."""
