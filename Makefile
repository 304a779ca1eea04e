# nano_infer: `make lab` to read, `make test` to check. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The GPU notebook check uses a real instruct model from the hub.
GPU_MODEL ?= Qwen/Qwen2.5-1.5B-Instruct

.PHONY: setup lab test test-unit test-notebooks test-gpu bench tiny-model tiny-draft clean

setup: $(STAMP)

# constraints.txt pins torch to the CPU build on this kind of machine; pyproject keeps ranges.
$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt -e '.[notebooks,test]'
	touch $(STAMP)

# Jupyter refuses to run as root (as in a container) unless told it may.
lab: setup
	$(VENV)/bin/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

test: test-unit test-notebooks

test-unit: setup
	$(PY) -m pytest tests -q

# nbval re-runs every notebook and checks its asserts; outputs are compared loosely (--nbval-lax).
test-notebooks: setup
	$(PY) -m pytest -q --nbval-lax --nbval-current-env notebooks/

test-gpu: setup
	NANO_INFER_MODEL=$(GPU_MODEL) $(PY) -m pytest -q --nbval-lax --nbval-current-env notebooks/

bench: setup
	$(PY) -m nano_infer.bench

tiny-model: setup
	$(PY) scripts/make_tiny_model.py
	$(PY) scripts/make_draft_model.py

# the draft for speculative decoding (chapter 09), distilled from the shipped model
tiny-draft: setup
	$(PY) scripts/make_draft_model.py

clean:
	rm -rf $(VENV) build *.egg-info
