"""Processors: handlers, runners, aggregations, claims and dead letters."""
