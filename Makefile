# Two commands for a newcomer: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv on first use and install what they need into it; nothing else is assumed.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch 2.13.0; any other request pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.reloadpg-installed

.PHONY: install test demo bench lint

$(STAMP): setup.cfg setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $@

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

demo: $(STAMP)
	$(PY) -m reloadpg_autopatch demo

bench: $(STAMP)
	$(PY) -m benchmarks

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
