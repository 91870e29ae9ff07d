"""Helpers for testing and benchmarking eventlanes against real databases."""
