"""The process: the service contract and supervisor, the one timing engine, systemd
notifications, disk-space checks."""
