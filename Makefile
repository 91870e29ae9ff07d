# The two commands of the README: `make demo` and `make test`. Each creates .venv on its own.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench docs docs-serve clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Stamp files: reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark,kafka,broker]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@ $(VENV)/.installed $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

# Four workers on two cores: most tests wait (on processes, servers, clocks) more than they
# compute. The tests of the session's JVM and cluster share one worker, those of the broker
# another (tests/conftest.py). The slowest tests are listed at the end: the suite's time is
# watched (15 minutes at most on two cores).
test: lint
	$(BIN)/pytest -q -n 4 --dist loadgroup --durations=20

# The documentation site (docs/, Sphinx): strict (-W -n: a warning, a broken link or a missing
# reference fails) and offline. tests/test_docs.py runs the same build in `make test`.
DOCS_OUT ?= docs/_build/html
docs: $(VENV)/.installed-dev
	$(BIN)/sphinx-build -q -b html -W --keep-going -n docs $(DOCS_OUT)
	@echo "built $(DOCS_OUT)/index.html"

docs-serve: docs
	$(BIN)/python -m http.server --directory $(DOCS_OUT) --bind 127.0.0.1 8000

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) demo-data .pytest_cache docs/_build build dist
