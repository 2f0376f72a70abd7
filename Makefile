# Two commands for a newcomer: `make demo` runs the main job, `make test` runs the tests.
# Both create a venv on first use and install what they need into it; nothing else is assumed.
# Two torch lanes, each pinned whole: the default, torch 2.13.0 (the CPU build; any other request
# pulls a multi-GB CUDA build) with megatron-core 0.16.1, the newest for Python 3.10 and 3.11; and
# TORCH_SPEC=torch==2.14.1 on Python 3.12 with megatron-core 0.19.2, the newest (it needs 3.12).
# Each default gives way to a value on the command line.
TORCH_SPEC ?= torch==2.13.0
LANE_214 := $(filter torch==2.14.1,$(TORCH_SPEC))
PYTHON ?= $(if $(LANE_214),python3.12,python3)
MEGATRON_DEFAULT := $(if $(LANE_214),megatron-core==0.19.2,megatron-core==0.16.1)
MEGATRON_SPEC ?= $(MEGATRON_DEFAULT)
# One venv per lane, so that switching lanes never reinstalls torch over another one: .venv for
# the default lane, .venv-torch2.14.1-py3.12 for TORCH_SPEC=torch==2.14.1, and a name of its own
# for any other torch, Python or megatron-core (`make test PYTHON=python3.10`).
tag = $(shell printf '%s' '$(1)' | tr -d '=' | tr -c 'A-Za-z0-9.+_-' '_')
PY_TAG = $(patsubst python%,py%,$(notdir $(PYTHON)))
OWN_MEGATRON = $(filter-out $(MEGATRON_DEFAULT),$(MEGATRON_SPEC))
LANE_VENV = .venv-$(call tag,$(TORCH_SPEC))-$(PY_TAG)$(addprefix -,$(call tag,$(OWN_MEGATRON)))
LANE = $(TORCH_SPEC)/$(PYTHON)/$(MEGATRON_SPEC)
VENV ?= $(if $(filter torch==2.13.0/python3/$(MEGATRON_DEFAULT),$(LANE)),.venv,$(LANE_VENV))
PY := $(VENV)/bin/python
STAMP := $(VENV)/.reloadpg-installed

# The start-up layer's lane: `make test-startup PYTHON=python3.12` runs the tests marked
# `startup` on that Python, in a venv with no torch (and so no megatron-core or Ray either).
STARTUP_VENV ?= .venv-startup-$(notdir $(PYTHON))
STARTUP_PY := $(STARTUP_VENV)/bin/python
STARTUP_STAMP := $(STARTUP_VENV)/.reloadpg-installed

.PHONY: install test test-unit test-ranks test-install test-startup demo bench lint

# The editable install copies the .pth and .start into site-packages: reinstall when they change.
# pyenv's shims run only the versions pyenv has selected; scripts/find-python asks pyenv for
# the others (python3.12 for the torch 2.14.1 lane).
$(STAMP): setup.cfg setup.py pyproject.toml reloadpg_autopatch.pth reloadpg_autopatch.start
	base=$$(scripts/find-python $(PYTHON)) && "$$base" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,bench]" "$(MEGATRON_SPEC)"
	touch $@

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# One kind of test at a time, by folder: tests/unit (in one process, seconds: the quick local
# loop), tests/ranks (several rank processes), tests/install (wheels, venvs, fresh interpreters).
test-unit test-ranks test-install: test-%: $(STAMP)
	$(PY) -m pytest tests/$*

# The package itself is not installed here: the tests build and install its wheel.
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
