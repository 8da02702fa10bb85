# Every target bootstraps .venv itself: on a fresh machine `make chat` and `make test` do all set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned: a plain `torch` would pull a multi-GB CUDA build; 2.13.0 is the CPU build on this disk.
TORCH := torch==2.13.0
SOURCES := $(wildcard actors/*.py actors/*/*.py native/*.py)

.PHONY: install test typecheck chat bench bench-quick clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Dependencies change rarely; llama-cpp-python builds from source once, then comes from pip's cache.
$(VENV)/.deps: pyproject.toml | $(PY)
	$(PIP) install $(TORCH)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -e '.[test,bench]' --config-settings editable_mode=strict
	touch $@

# Strict editable installs link each file; re-link when a module is added or removed.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-deps -e . --config-settings editable_mode=strict
	touch $@

install: $(VENV)/.installed

# The tests also run the Ray Serve deployment: the ray extra, only for them (make chat does not need it).
$(VENV)/.ray: pyproject.toml | $(VENV)/.deps
	$(PIP) install -q -e '.[ray]' --config-settings editable_mode=strict
	touch $@

test: install $(VENV)/.ray
	$(PY) -m pytest $(PYTEST_ARGS)

typecheck: install
	$(PY) -m mypy actors native

chat: install
	$(VENV)/bin/llamactor chat $(CHAT_ARGS)

bench: install
	$(VENV)/bin/llamactor bench $(BENCH_ARGS)

bench-quick: install
	$(VENV)/bin/llamactor bench --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
