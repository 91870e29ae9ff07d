"""Executors: one module per delivery guarantee, each committing a segment's work with its token."""
