# Two set-up-and-go targets: `make train` and `make test`. Both create .venv when needed.
# Torch: a torch the system python already has (e.g. a CUDA build) is kept through
# --system-site-packages; otherwise torch==$(TORCH_VERSION) is installed first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
ARGS ?=

.PHONY: venv train test test-gpu bench clean

venv: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml
	@if $(PYTHON) -c "import torch" >/dev/null 2>&1; then \
	  echo "[foxdqn] using the torch of $(PYTHON)"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q "torch==$(TORCH_VERSION)"; \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

train: venv
	$(PY) -m foxdqn.train $(ARGS)

test: venv
	$(PY) -m pytest -q -m "not gpu" $(ARGS)

test-gpu: venv
	$(PY) -m pytest -q -m gpu $(ARGS)

bench: venv
	$(PY) -m bench.run $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun
