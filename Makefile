# kvtuner developer entry points. `make run` opens the app on the embedded default model,
# `make test` runs the test suite (both create .venv and install kvtuner into it first).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test plan

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/kvtuner

plan: $(STAMP)
	$(VENV)/bin/kvtuner plan

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(VENV)/bin/python -m pytest
