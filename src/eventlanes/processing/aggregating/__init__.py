"""Aggregations: definitions, their executor, the fold kernel shared with Spark, dedupe on source
chains, declarative folds and their SQL pushdown.
"""
