"""Failures: failure model, degraded-cluster policies (drop, spares, NTP) and Monte Carlo."""
