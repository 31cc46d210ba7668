"""Load and latency measurements against a running streamtts server (loopback only)."""
