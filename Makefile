# The README's two commands. Both install what they need into .venv first (idempotent: the
# install re-runs only when setup.cfg or the install scripts change).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.arl-installed

.PHONY: install test demo lint clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/install.sh scripts/stub_wheels.py
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m arl.cli demo

lint: $(STAMP)
	$(VENV)/bin/ruff check arl tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
