"""The engine: due jobs become ready (`due_scan`), are claimed and run within the limits (`pool`,
`limiter`, `budget`, `executor`), and their outcomes are stored (`completer`); the running jobs of
a daemon that is gone are rescued (`gone_owners`); old rows are pruned and gauges sampled."""
