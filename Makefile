# Two commands for a newcomer: `make demo` runs the main job, `make test` runs the tests.
# Both create a venv on first use and install what they need into it; nothing else is assumed.
PYTHON ?= python3
# The CPU build of torch 2.13.0; any other request pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# One venv per torch lane, so that switching lanes never reinstalls torch over the other one:
# .venv for the default spec, .venv-torch2.14.1 for TORCH_SPEC=torch==2.14.1.
VENV ?= $(if $(filter torch==2.13.0,$(TORCH_SPEC)),.venv,.venv-$(shell printf '%s' '$(TORCH_SPEC)' | tr -d '=' | tr -c 'A-Za-z0-9.+_-' '_'))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.reloadpg-installed

# The start-up layer's lane: `make test-startup PYTHON=python3.12` runs the tests marked
# `startup` on that Python, in a venv with no torch (and so no megatron-core or Ray either).
STARTUP_VENV ?= .venv-startup-$(notdir $(PYTHON))
STARTUP_PY := $(STARTUP_VENV)/bin/python
STARTUP_STAMP := $(STARTUP_VENV)/.reloadpg-installed

.PHONY: install test test-startup demo bench lint

# The editable install copies the .pth and .start into site-packages: reinstall when they change.
$(STAMP): setup.cfg setup.py pyproject.toml reloadpg_autopatch.pth reloadpg_autopatch.start
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,bench]"
	touch $@

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# pyenv's shims run only the versions pyenv has selected; scripts/find-python asks pyenv for
# the others. The package itself is not installed here: the tests build and install its wheel.
$(STARTUP_STAMP):
	base=$$(scripts/find-python $(PYTHON)) && "$$base" -m venv $(STARTUP_VENV)
	$(STARTUP_PY) -m pip install --quiet --upgrade pip
	$(STARTUP_PY) -m pip install --quiet "pytest>=8" "pytest-timeout>=2.3" "build>=1.2"
	touch $@

test-startup: $(STARTUP_STAMP)
	@$(STARTUP_PY) -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") and \
		"torch is importable in $(STARTUP_VENV): this lane tests the package without it")'
	$(STARTUP_PY) -m pytest -m startup

demo: $(STAMP)
	$(PY) -m reloadpg_autopatch demo

bench: $(STAMP)
	$(PY) -m benchmarks

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
