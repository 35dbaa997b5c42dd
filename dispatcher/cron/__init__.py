"""Cron, in one place: the expression and its periods (`expression`), the `[[schedules]]`
configuration (`schedules`), and the service that fires them once per period (`service`,
`periods`)."""
