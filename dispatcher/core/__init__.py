"""Plain values every layer shares: JSON encoding, RFC 3339 times, crash-test fault points."""
