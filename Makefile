# Two entry points: `make bench GPU=<profile>` (on a GPU machine) and `make test` (anywhere).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Used only when the environment has no torch at all; an installed (CUDA) torch is never replaced.
TORCH_SPEC ?= torch==2.13.0
GPU ?=
OUT ?= results/$(GPU)

.PHONY: venv bench test clean

# --system-site-packages: a GPU machine's own CUDA build of torch (and FlashInfer, CUPTI) stays visible.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

bench: $(VENV)/.installed
	@test -n "$(GPU)" || { echo "make bench: set GPU=<profile> (h100, h200, b200, gb200)" >&2; exit 2; }
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || \
	  { echo "make bench: no CUDA GPU visible on this machine; run it on a GPU machine (nothing was written)" >&2; exit 2; }
	$(PY) -m pip install -q -e ".[gpu]"
	$(PY) -m bench run --gpu $(GPU) --out $(OUT)

test: $(VENV)/.installed
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info
