"""Calling user code for one batch: the handler's context, dispatch, and how failures read."""
