# One command sets up, one command tests. See README.md.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test test-slow test-all benchmark clean

setup: $(STAMP)

# Re-runs only when requirements.txt or pyproject.toml change (idempotent).
$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 9) <= v <= (3, 11) else "tff_clip needs Python 3.9-3.11 (TensorFlow Federated 0.87 supports no other); found %d.%d. Set PYTHON=/path/to/python3.11." % v)' \
	  || { echo "Python interpreter '$(PYTHON)' not usable; install Python 3.11 or pass PYTHON=..."; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# TFF pins jax==0.4.14, which is not served here; its other needs are in requirements.txt.
	$(PY) -m pip install -q --no-deps tensorflow-federated==0.87.0
	# setuptools calls [tool.setuptools] beta at every build: a notice, not a fault.
	PYTHONWARNINGS=ignore::UserWarning $(PY) -m pip install -q --no-deps --no-build-isolation -e .
	TF_CPP_MIN_LOG_LEVEL=3 $(PY) -c 'import tensorflow_federated, tensorflow_privacy, dp_accounting, sklearn, tensorflow_datasets, tff_clip; from tff_clip.runtime import execution; execution.close_tff_context_at_exit(); print("tff_clip environment ready")'
	@touch $(STAMP)

# Test files run in parallel, one process per core (at most 4; each holds its
# own TensorFlow), a file's tests in one process so its module-scoped fixtures
# (built processes, traced computations) are built once. PYTEST_WORKERS=0 runs
# them in this process.
PYTEST_WORKERS ?= auto
XDIST  := -n $(PYTEST_WORKERS) --maxprocesses=4 --dist=loadfile

# The default test run (what CI runs): everything not marked slow.
test: setup
	$(PY) -m pytest $(XDIST) -m "not slow"

test-slow: setup
	$(PY) -m pytest $(XDIST) -m slow

test-all: setup
	$(PY) -m pytest $(XDIST)

benchmark: setup
	$(PY) -m scripts.benchmark_aggregators

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
