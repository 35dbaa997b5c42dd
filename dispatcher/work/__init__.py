"""Running jobs: limits (token bucket, in-flight cap), retry policy, the worker pool."""
