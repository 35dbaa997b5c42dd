"""The operator web console: server-rendered pages under /console/ on the API listener (or on
DISPATCHER_CONSOLE_LISTEN), signed in with the API's own tokens, acting through the same
operator service as the API and the CLI (dispatcher.operator.service)."""
