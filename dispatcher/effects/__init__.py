"""Effects: what running a job does (HTTP push, configured SQL, Python handler)."""
