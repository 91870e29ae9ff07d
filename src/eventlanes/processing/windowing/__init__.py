"""Windowed aggregations in the local engine: the store's clock read from the log, and the
executor that folds each input into its time windows, closes them and keeps the late ones."""
