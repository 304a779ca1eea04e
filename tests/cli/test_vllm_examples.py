"""vLLM's offline examples, in their shape, with only the import (`vllm` -> `nano_infer`) and the model changed.

The scripts below are this project's own, written to make the calls vLLM's examples in
examples/offline_inference make, in the same order (basic/generate.py and the older offline_inference.py,
llm_engine_example.py, reproducibility.py, prefix_caching.py): a flag parser built from `EngineArgs`, an
`LLM` or `LLMEngine` made from it, `add_request` / `step`, an engine seed, prefix caching and its reset.
They run as `__main__` with a command line, and the tests read what they print. The model is the one
shipped in the package.
"""
import contextlib
import io
import sys

import pytest

from nano_infer.models.loader import TINY_MODEL_DIR

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LINES = ["Friends, Romans, countrymen,", "Now is the winter of", "Shall I compare thee to", "All the world's a"]

BASIC_GENERATE = '''
from nano_infer import LLM, EngineArgs
from nano_infer.utils.argparse_utils import FlexibleArgumentParser

SAMPLING_FLAGS = {"--max-tokens": int, "--temperature": float, "--top-p": float, "--top-k": int}


def flags():
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)  # every engine option as a flag
    parser.set_defaults(model=MODEL)
    group = parser.add_argument_group("sampling")
    for flag, kind in SAMPLING_FLAGS.items():
        group.add_argument(flag, type=kind)
    return parser


def run(options: dict):
    sampling = {name: options.pop(name) for name in ("max_tokens", "temperature", "top_p", "top_k")}
    llm = LLM(**options)  # what is left are engine options
    params = llm.get_default_sampling_params()
    for name, value in sampling.items():
        if value is not None:
            setattr(params, name, value)
    for out in llm.generate(LINES, params):
        print(f"Prompt: {out.prompt!r} -> {out.outputs[0].text!r} (Tokens: {len(out.outputs[0].token_ids)})")


if __name__ == "__main__":
    run(vars(flags().parse_args()))
'''

OFFLINE_INFERENCE_WITH_ENGINE_ARGS = '''
import dataclasses

from nano_infer import LLM, SamplingParams
from nano_infer.engine.arg_utils import EngineArgs
from nano_infer.utils import FlexibleArgumentParser

engine_args = EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args())
llm = LLM(**dataclasses.asdict(engine_args))
for out in llm.generate(LINES[:2], SamplingParams(temperature=0.0, max_tokens=6)):
    print(f"{out.prompt!r} -> Generated text: {out.outputs[0].text!r}")
print(f"max_model_len: {llm.engine.max_model_len}, prefix cache: {llm.engine.config.prefix_cache}")
'''

LLM_ENGINE_EXAMPLE = '''
from nano_infer import EngineArgs, LLMEngine, RequestOutput, SamplingParams
from nano_infer.utils.argparse_utils import FlexibleArgumentParser

REQUESTS = [
    (LINES[0], SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1)),
    (LINES[1], SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2)),
    (LINES[2], SamplingParams(n=2, temperature=0.8, top_p=0.95, frequency_penalty=0.1)),
]


def serve(engine: LLMEngine, queue: list) -> None:
    """One request joins per step while any wait; every step's finished outputs are printed."""
    next_id = 0
    while queue or engine.has_unfinished_requests():
        if queue:
            prompt, params = queue.pop(0)
            engine.add_request(str(next_id), prompt, params)
            next_id += 1
        outputs: list[RequestOutput] = engine.step()
        for out in outputs:
            if out.finished:
                print(f"finished {out.request_id}: {len(out.outputs)} output(s), {len(out.outputs[0].token_ids)} tokens")


if __name__ == "__main__":
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(description="LLMEngine, step by step"))
    serve(LLMEngine.from_engine_args(EngineArgs.from_cli_args(parser.parse_args())), list(REQUESTS))
'''

REPRODUCIBILITY = '''
from nano_infer import LLM, SamplingParams

SEED = 42  # the engine's: sampled requests without a seed of their own then repeat from run to run

if __name__ == "__main__":
    llm = LLM(model=MODEL, seed=SEED, max_model_len=256)
    for out in llm.generate(LINES[:3], SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12)):
        print(f"{out.prompt!r} -> Generated text: {out.outputs[0].text!r}")
'''

PREFIX_CACHING = '''
from nano_infer import LLM, SamplingParams
from nano_infer.distributed import cleanup_dist_env_and_memory

SHARED = ("You are the prompter of a company of players rehearsing in an inn yard. The actors forget their "
          "lines, the candles gutter, and the play opens tomorrow before the whole town. When an actor stops, "
          "you give him the rest of his line and nothing else, in the words of the play. The next line is: ")
prompts = [SHARED + line for line in LINES]
params = SamplingParams(temperature=0.0, max_tokens=8)


def texts(llm) -> list[str]:
    return [out.outputs[0].text for out in llm.generate(prompts, params)]


if __name__ == "__main__":
    plain = LLM(model=MODEL, gpu_memory_utilization=0.4, enable_prefix_caching=False, max_model_len=512)
    without = texts(plain)
    del plain
    cleanup_dist_env_and_memory()

    cached = LLM(model=MODEL, enable_prefix_caching=True, gpu_memory_utilization=0.4, max_model_len=512)
    cached.generate(prompts[0], params)  # computes the shared prefix's blocks once
    outs = cached.generate(prompts, params)
    print(f"Generated answers are the same: {[o.outputs[0].text for o in outs] == without}")
    print(f"Cached prompt tokens: {min(o.num_cached_tokens for o in outs)}")
    print(f"Prefix cache reset: {cached.reset_prefix_cache()}")
    print(f"Cached prompt tokens after the reset: {cached.generate(prompts[0], params)[0].num_cached_tokens}")
'''


def run_example(source: str, *argv: str) -> str:
    """Run a script as __main__ with `argv` on its command line; what it printed."""
    out, saved = io.StringIO(), sys.argv
    sys.argv = ["example.py", *argv]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "example.py", "exec"), {"__name__": "__main__", "MODEL": str(TINY_MODEL_DIR), "LINES": LINES})
    finally:
        sys.argv = saved
    return out.getvalue()


def test_basic_generate_builds_its_llm_from_engine_args_flags_with_underscores_and_equals():
    printed = run_example(BASIC_GENERATE, "--max_model_len=128", "--max-num-seqs", "8", "--max_tokens=5",
                          "--temperature", "0", "--no-enable-prefix-caching")
    assert printed.count("Prompt: ") == 4 and printed.count("(Tokens: 5)") == 4, printed


def test_offline_inference_makes_llm_from_asdict_of_engine_args():
    printed = run_example(OFFLINE_INFERENCE_WITH_ENGINE_ARGS, "--model", str(TINY_MODEL_DIR), "--max_model_len",
                          "96", "--enforce-eager", "--seed", "0", "--no-enable-prefix-caching")
    assert printed.count("Generated text: ") == 2
    assert "max_model_len: 96, prefix cache: None" in printed, printed


def test_llm_engine_example_adds_requests_and_steps_an_engine_from_engine_args():
    printed = run_example(LLM_ENGINE_EXAMPLE, "--model", str(TINY_MODEL_DIR), "--max-model-len=64", "--block_size", "8")
    finished = sorted(line for line in printed.splitlines() if line.startswith("finished"))
    assert [f.split(":")[0] for f in finished] == ["finished 0", "finished 1", "finished 2"], printed
    assert "finished 2: 2 output(s)" in printed and "finished 0: 1 output(s), 16 tokens" in printed


def test_reproducibility_prints_the_same_samples_on_every_run_with_the_engine_seed():
    first, second = run_example(REPRODUCIBILITY), run_example(REPRODUCIBILITY)
    assert first == second and first.count("Generated text: ") == 3
    unseeded = REPRODUCIBILITY.replace("seed=SEED", "seed=SEED + 1")
    assert run_example(unseeded) != first  # the seed is what makes the runs agree


def test_prefix_caching_gives_the_same_text_from_cached_blocks_and_reset_prefix_cache_drops_them():
    printed = run_example(PREFIX_CACHING)
    assert "Generated answers are the same: True" in printed, printed
    cached = int(printed.split("Cached prompt tokens: ")[1].split()[0])
    assert cached >= 48  # the shared prefix, in whole blocks of 16
    assert "Prefix cache reset: True" in printed and "Cached prompt tokens after the reset: 0" in printed
