# `make test` (anywhere); on a GPU machine: `make bench|forward|baseline|regress|host-anatomy GPU=<profile>`;
# `make report` (anywhere) renders report.html from RESULTS.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Used only when the environment has no torch at all; an installed (CUDA) torch is never replaced.
TORCH_SPEC ?= torch==2.13.0
GPU ?=
DEVICES ?=
OUT ?= results/$(GPU)

.PHONY: venv gpu-env bench table forward baseline regress host-anatomy report test test-installed evidence clean
# `make report`'s defaults: the shipped H200 table's own out-of-sample check runs (python -m evidence_store current), so the
# first page shows the current answer; COMPARE is empty (no second run) unless given
RESULTS ?= $(shell $(PYTHON) -m evidence_store current h200 check-sweep 2>/dev/null)
COMPARE ?=
BASELINE ?= calibrate/baselines/h200.json
ANATOMY ?= tests/data/h200-host-anatomy
FORWARD ?= $(shell $(PYTHON) -m evidence_store current h200 check-forward 2>/dev/null)
REPORT ?= report.html
# Recipes read these from the environment, quoted ("$$GPU"): a value is never shell code (GPU='h200;rm x' is a name
# the profile check refuses).
export GPU DEVICES GRID OUT RESULTS COMPARE BASELINE ANATOMY FORWARD REPORT RUN_ID RESUME SAME_MACHINE MACHINES

# --system-site-packages: a GPU machine's own CUDA build of torch (and FlashInfer, CUPTI) stays visible.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# Every GPU target: GPU= set, a CUDA GPU visible, the [gpu] extra installed; one line and exit 2 otherwise.
gpu-env: $(VENV)/.installed
	@test -n "$$GPU" || { echo "make: set GPU=<profile> (h100, h200, b200, gb200)" >&2; exit 2; }
	@$(PY) -m bench profiles "$$GPU" >/dev/null
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || \
	  { echo "make: no CUDA GPU visible on this machine; run it on a GPU machine (nothing was written)" >&2; exit 2; }
	$(PY) -m pip install -q -e ".[gpu]"
	@if [ "$$($(PY) -m bench profiles "$$GPU" | sed -n 's/^[a-z0-9]* *SM\([0-9]*\).*/\1/p')" -ge 100 ]; then \
	  $(PY) -m pip install -q -e ".[gpu-sm100]" && \
	  $(PY) -c "import cutlass.cute, cuda.bindings.driver" 2>/dev/null || \
	  { echo "make: the SM100 paths need nvidia-cutlass-dsl[cu13] and cuda-python (cutlass.cute, cuda.bindings); pip install -e '.[gpu-sm100]'" >&2; exit 2; }; fi

bench: gpu-env
	$(PY) -m bench run --gpu "$$GPU" --out "$$OUT" $${DEVICES:+--devices "$$DEVICES"} $${GRID:+--grid "$$GRID"}

baseline: gpu-env
	$(PY) -m calibrate baseline --gpu "$$GPU"

regress: gpu-env
	$(PY) -m pytest -q -m gpu tests/test_gpu_regression.py

# the table pipeline (tables/); RUN_ID=... with RESUME=1 continues a run (the other fitting
# machines' sweeps and the check, each on another machine), SAME_MACHINE=1 runs them here, MACHINES=N fits on N
table: gpu-env
	$(PY) -m tables --gpu "$$GPU" $${RUN_ID:+--run-id "$$RUN_ID"} $${RESUME:+--resume} $${REFIT:+--refit} $${SAME_MACHINE:+--same-machine} $${MACHINES:+--machines "$$MACHINES"}

forward: gpu-env
	$(PY) -m bench forward --gpu "$$GPU" --skip-slower 3 --out "results/$$GPU-forward"

host-anatomy: gpu-env
	$(PY) -m bench host-anatomy --gpu "$$GPU" --out "results/$$GPU-host-anatomy"

report: $(VENV)/.installed
	set -f; $(PY) -m reports build $$RESULTS $$COMPARE $${BASELINE:+--baseline "$$BASELINE"} \
	  $${ANATOMY:+--anatomy "$$ANATOMY"} $${FORWARD:+--forward $$FORWARD} -o "$$REPORT"

# one pytest worker per core (pytest-xdist, in the dev extra); the workers share one C++ build, and one worker
# builds the report tests' report (their xdist_group)
test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not evidence and not installed" -n auto --dist loadgroup

# a wheel of this checkout installed into a fresh virtual environment, the README's commands run from elsewhere
test-installed: $(VENV)/.installed
	$(PY) -m pytest -q -m installed -n auto

evidence: $(VENV)/.installed
	$(PY) -m pytest -q -m evidence

clean:
	rm -rf $(VENV) *.egg-info
