# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each installs what it needs. torch is pinned to 2.13.0 (the CPU wheel these machines carry)
# unless a torch >= 2.11 is already installed, as on the GPU machine.
PYTHON ?= python3
PYTEST_ARGS ?=

.PHONY: install demo test sweep

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q torch==2.13.0
	@$(PYTHON) -m pip install -q pytest pytest-xdist expecttest hypothesis scipy
	@$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e .

demo: install
	$(PYTHON) -m aotgrad.demo

test: install
	$(PYTHON) -m pytest -n 2 $(PYTEST_ARGS)

sweep: install
	$(PYTHON) -m tools.opdb_sweep --samples 2
