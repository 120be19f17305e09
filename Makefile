# otelgpu developer entry points. Everything a fresh Debian + Python 3.11 machine needs
# is installed by these targets into ./.venv (nothing pre-installed is assumed).
#
#   make demo   - the main job: the demo workload on the simulated GPU (or a real one)
#   make test   - the whole test suite: lint, types, and pytest twice (native, pure Python)
#   make reliability / make soak - the reliability probes, then docs/reliability.md

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
PIP    := $(VPY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.otelgpu-deps
TORCH_VERSION ?= 2.13.0

.PHONY: demo test lint format typecheck-tests pytest pytest-native pytest-pure ext venv deps bench \
	test-gpu clean backend-deps browser-deps reliability soak

# setuptools-scm: some test dependencies (gpustat) ship only sdists whose build needs it, and the
# editable install below runs without build isolation (so those builds use this venv).
$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "setuptools>=69" wheel "Cython>=3.0.10" "setuptools-scm>=8"

# Dependencies are re-installed only when their declarations change (CI keeps .venv warm).
$(STAMP): $(VPY) pyproject.toml $(wildcard tests/requirements/*.txt)
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -r tests/requirements/vllm.txt
	$(PIP) install -q --no-deps -r tests/requirements/vllm-nodeps.txt
	$(PIP) install -q --no-build-isolation -e ".[test,prometheus,bench,report]"
	touch $(STAMP)

venv deps: $(STAMP)

# (Re)build the native parts in place; flock keeps parallel builds from clobbering each other.
ext: $(STAMP)
	flock .ext.lock $(VPY) setup.py -q build_ext --inplace -j 2

demo: ext
	$(VPY) -m otelgpu demo

# Every test area and top-level test file, each checked on its own (every area has a
# conftest.py); a new area is checked as soon as it exists.
TYPED_TESTS ?= $(sort $(dir $(wildcard tests/*/*.py))) $(wildcard tests/*.py)
MYPY_TESTS   = $(VENV)/bin/mypy --no-warn-unused-ignores --allow-untyped-calls

lint: $(STAMP) typecheck-tests
	$(VENV)/bin/ruff check otelgpu tests benchmarks setup.py
	$(VENV)/bin/ruff format --check otelgpu tests benchmarks setup.py
	$(VENV)/bin/mypy
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH cython-lint src_ext
	$(VENV)/bin/codespell otelgpu tests docs benchmarks src_ext setup.py Makefile

typecheck-tests: $(STAMP)
	@for t in $(TYPED_TESTS); do echo "mypy $$t"; MYPYPATH=tests $(MYPY_TESTS) $$t || exit 1; done

# Rewrite the code into the house style (what `make lint` checks), and regenerate the
# metric tables of docs/metrics*.md from otelgpu/metrics/catalog.py.
format: $(STAMP)
	$(VENV)/bin/ruff check --fix otelgpu tests benchmarks setup.py
	$(VENV)/bin/ruff format otelgpu tests benchmarks setup.py
	$(VPY) -m otelgpu.metrics.markdown docs

# Real-backend tests (tests/backends/) need prometheus + promtool (Debian package, needs root).
backend-deps:
	@[ "$${OTELGPU_SKIP_BACKENDS:-0}" = 1 ] || sh tests/backends/install.sh

# Report and live-view tests (tests/report/) need a real browser and a real terminal:
# Debian's chromium + chromium-driver (driven by Selenium) and tmux (needs root).
browser-deps:
	sh tests/report/install.sh

pytest-native: ext backend-deps browser-deps
	$(VPY) -m pytest -q $(PYTEST_ARGS)

pytest-pure: ext backend-deps browser-deps
	OTELGPU_NO_EXTENSIONS=1 $(VPY) -m pytest -q $(PYTEST_ARGS)

pytest: pytest-native pytest-pure

test: lint pytest

test-gpu: ext
	$(VPY) -m pytest -q -m gpu tests/gpu

bench: ext
	$(VPY) benchmarks/run_all.py

# The reliability suite (tests/reliability, also part of `make test`) once per twin, writing
# the probe rows, then docs/reliability.md from them. `make soak`: the long versions (a 60 s
# collector outage, 1,000,000 steps and requests). Failed rows do not stop the table from
# being written; the renderer's exit status says whether an asserted row failed.
RELIABILITY = $(VPY) -m pytest -q -m reliability tests/reliability tests/vllm/test_vllm_privacy.py \
	-p no:cacheprovider
reliability soak: ext
	-$(if $(filter soak,$@),OTELGPU_SOAK=1) OTELGPU_RELIABILITY_OUT=benchmarks/results/reliability-native.json $(RELIABILITY)
	-$(if $(filter soak,$@),OTELGPU_SOAK=1) OTELGPU_NO_EXTENSIONS=1 OTELGPU_RELIABILITY_OUT=benchmarks/results/reliability-pure.json $(RELIABILITY)
	$(VPY) benchmarks/reliability_table.py

clean:
	rm -rf build $(VENV) .ext.lock
	find otelgpu -name '*.so' -delete -o -name '*.so.1' -delete
