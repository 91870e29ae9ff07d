# The eventlanes pytest plugin: a fresh store per test, on SQLite and on PostgreSQL.
pytest_plugins = ["eventlanes.testing.pytest_plugin"]
