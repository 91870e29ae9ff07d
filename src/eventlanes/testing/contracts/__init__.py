"""Conformance test suites that every backend must pass: subclass them and say how to open one."""
