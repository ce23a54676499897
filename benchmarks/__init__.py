"""Benchmarks (`make bench`): speed targets are measured here, never asserted in tests."""
