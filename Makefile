# Two set-up-and-go targets: `make train` and `make test`. Both create .venv when needed.
# Torch: a torch the system python already has (e.g. a CUDA build) is kept through
# --system-site-packages; otherwise torch==$(TORCH_VERSION) is installed first. A python3 that runs
# inside a virtual environment (an activated venv) counts as none: the new .venv would see its base
# interpreter's packages, not the venv's torch, and pip would pull whatever torch is newest.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
ARGS ?=
# test workers (pytest-xdist; each test file stays in one worker, the files with the most `slow` tests
# first: tests/conftest.py orders them, --no-loadscope-reorder keeps that order): one per core by default
TEST_WORKERS ?= auto

.PHONY: venv train test test-gpu bench sweep report clean

venv: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml
	@if $(PYTHON) -c "import sys, torch; sys.exit(sys.prefix != sys.base_prefix)" >/dev/null 2>&1; then \
	  echo "[foxdqn] creating $(VENV) once: keeping the torch of $(PYTHON) (--system-site-packages); pip installs"; \
	  echo "[foxdqn] foxdqn's dev extra next (about 1 GB, triton the largest): 1-3 minutes on 2 cores"; \
	  $(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
	  echo "[foxdqn] creating $(VENV) once: $(PYTHON) has no torch of its own (or runs in a venv), so pip installs"; \
	  echo "[foxdqn] torch==$(TORCH_VERSION) first (PyPI's Linux wheel brings its CUDA libraries, about 3 GB; a CPU wheel"; \
	  echo "[foxdqn] is about 200 MB), then foxdqn's"; \
	  echo "[foxdqn] dev extra (about 1 GB): 2-4 minutes with the wheels at hand, longer on a slow network"; \
	  $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q "torch==$(TORCH_VERSION)"; \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@
	@echo "[foxdqn] $(VENV) is ready"

train: venv
	$(PY) -m foxdqn.train $(ARGS)

# the CPU suite runs the Triton kernels in the interpreter, which checks less than the compiler:
# every launch is recorded and then compiled for sm_90 on the CPU (tests/compile_kernels.py)
test: venv
	@rm -rf .kernel-record
	FOXDQN_KERNEL_RECORD=$(CURDIR)/.kernel-record $(PY) -m pytest -q -m "not gpu" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)
	$(PY) tests/compile_kernels.py .kernel-record $(if $(ARGS),--allow-empty,)

test-gpu: venv
	$(PY) -m pytest -q -m gpu $(ARGS)

bench: venv
	$(PY) -m bench.run $(ARGS)

# a Hydra multirun, e.g. make sweep ARGS="seed=0,1,2 optim.lr=1e-4,3e-4"; it ends with the sweep report
sweep: venv
	$(PY) -m foxdqn.train --multirun $(ARGS)

# (re)write the report of a sweep folder (report.md, report.json, report.csv, plots/):
# make report DIR=multirun/eurusd_dqn/<date>
report:
	@test -n "$(DIR)" || { echo "make report: set DIR=<a multirun folder>" >&2; exit 2; }
	@$(MAKE) -s --no-print-directory venv
	$(PY) -m foxdqn.report "$(DIR)"

clean:
	rm -rf $(VENV) outputs multirun
