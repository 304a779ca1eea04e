"""EleutherAI's lm-evaluation-harness, as is (`make lm-eval` installs it, pinned), against a live
`nano-infer serve --dtype float32`: a generate_until and a multiple-choice task on local data
(tests/lm_eval_tasks/), run with lm-eval's default settings for `local-completions` (one prompt
per request, sent as token ids; each choice scored with echo + logprobs). The oracle is lm-eval's
own transformers backend (`hf`) on the same weights: the same accuracy, the same log-likelihood of
every choice, the same generations."""
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nano_infer
from tests.helpers.engine_checks import free_port, wait_until_serving

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: `make lm-eval` installs it")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "lm_eval_tasks"
TINY = Path(nano_infer.__file__).parent / "models" / "tiny"
ATOL = 1e-4  # a choice's log-likelihood, float32 on both sides


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Offline, with a datasets cache of its own."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp_path_factory.mktemp("datasets")), "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def served(env):
    """`nano-infer serve` in a process of its own, as a user starts it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "nano_infer", "serve", "--model", str(TINY), "--dtype", "float32",
                             "--port", str(port), "--served-model-name", "nano", "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, url)
    yield url
    proc.terminate()
    proc.wait(30)


def lm_eval(out: Path, env: dict, tasks: list[str], *args: str) -> tuple[dict, dict]:
    """Run the lm_eval command; (results, {task: {doc_id: sample}})."""
    cmd = [sys.executable, "-m", "lm_eval", *args, "--tasks", ",".join(tasks), "--include_path", str(TASKS),
           "--output_path", str(out), "--log_samples"]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    samples = {task: {s["doc_id"]: s for s in map(json.loads, next(out.rglob(f"samples_{task}_*.jsonl")).open())}
               for task in tasks}
    return results, samples


def choice_scores(samples: dict) -> dict:
    """{doc_id: [(log-likelihood, is_greedy) per choice]} of a multiple-choice task's samples."""
    return {i: [(float(ll), str(greedy)) for ll, greedy in s["filtered_resps"]] for i, s in samples.items()}


def largest_difference(got: dict, want: dict) -> float:
    assert got.keys() == want.keys() and len(want) == 12
    assert {i: [g for _, g in c] for i, c in got.items()} == {i: [g for _, g in c] for i, c in want.items()}
    return max(abs(a - b) for i in want for (a, _), (b, _) in zip(got[i], want[i]))


def test_lm_eval_scores_through_the_server_as_its_transformers_backend(served, env, tmp_path):
    tasks, served_args = ["nano_mc", "nano_gen"], f"model=nano,base_url={served}/v1/completions,tokenizer={TINY}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two processes: one mostly waits on the server
        served_run = pool.submit(lm_eval, tmp_path / "served", env, tasks, "--model", "local-completions",
                                 "--model_args", served_args)
        hf_run = pool.submit(lm_eval, tmp_path / "hf", env, tasks, "--model", "hf", "--model_args",
                             f"pretrained={TINY},dtype=float32", "--device", "cpu")
        (ours, our_samples), (theirs, their_samples) = served_run.result(), hf_run.result()
    assert ours["nano_mc"]["acc,none"] == theirs["nano_mc"]["acc,none"]
    assert ours["nano_gen"]["exact_match,none"] == theirs["nano_gen"]["exact_match,none"] > 0
    want = choice_scores(their_samples["nano_mc"])
    worst = largest_difference(choice_scores(our_samples["nano_mc"]), want)
    assert worst < ATOL, worst
    gens = [(s["filtered_resps"], their_samples["nano_gen"][i]["filtered_resps"]) for i, s in our_samples["nano_gen"].items()]
    assert all(got == want for got, want in gens), gens
    # batched: 4 prompts per request, 2 requests at once
    batched, batched_samples = lm_eval(tmp_path / "batched", env, ["nano_mc"], "--model", "local-completions",
                                       "--model_args", served_args + ",num_concurrent=2", "--batch_size", "4")
    assert batched["nano_mc"]["acc,none"] == theirs["nano_mc"]["acc,none"]
    worst_batched = largest_difference(choice_scores(batched_samples["nano_mc"]), want)
    assert worst_batched < ATOL, worst_batched
    print(f"\nlm-eval through nano-infer serve vs its hf backend: acc {ours['nano_mc']['acc,none']:.3f} vs "
          f"{theirs['nano_mc']['acc,none']:.3f}, exact_match {ours['nano_gen']['exact_match,none']:.3f} vs "
          f"{theirs['nano_gen']['exact_match,none']:.3f}, largest log-likelihood difference {worst:.2e} "
          f"({worst_batched:.2e} batched)")
