"""Side-by-side benchmark of dispatcher and its peers (graphile-worker, pg-boss, procrastinate)."""
