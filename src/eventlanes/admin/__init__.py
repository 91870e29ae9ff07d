"""Inspecting and steering processors and ingestors: views, status, reset, dead letters, versions,
health, metrics.
"""
