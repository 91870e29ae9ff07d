"""Declarative folds run inside the database: one module per backend."""
