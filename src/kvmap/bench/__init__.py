"""Benchmarks: scenarios, runs, metrics and records."""
