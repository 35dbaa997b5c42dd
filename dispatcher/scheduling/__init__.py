"""Time-driven work: the due-scan, lease rescue, cron schedules, metric sampling."""
