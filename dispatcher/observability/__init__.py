"""What operators see: Prometheus metrics, JSON logs, OpenTelemetry traces."""
