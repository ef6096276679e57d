"""Weir's benchmarks: ``make bench-exchange``, ``make bench-quick``, ``make bench`` (docs/benchmarks.md)."""
