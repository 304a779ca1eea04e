"""vLLM's offline examples, in their shape, with only the import (`vllm` -> `nano_infer`) and the model changed.

Each script below was written for this project after the example of the same name in vLLM's
examples/offline_inference (basic/generate.py and the older offline_inference.py, llm_engine_example.py,
reproducibility.py, prefix_caching.py): the same calls, in the same order, with the same names. They run as
`__main__` with a command line, and the tests read what they print. The model is the one shipped in the package.
"""
import contextlib
import io
import sys

import pytest

from nano_infer.models.loader import TINY_MODEL_DIR

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BASIC_GENERATE = '''
from nano_infer import LLM, EngineArgs
from nano_infer.utils.argparse_utils import FlexibleArgumentParser


def create_parser():
    parser = FlexibleArgumentParser()
    # Add engine args
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model=MODEL)
    # Add sampling params
    sampling_group = parser.add_argument_group("Sampling parameters")
    sampling_group.add_argument("--max-tokens", type=int)
    sampling_group.add_argument("--temperature", type=float)
    sampling_group.add_argument("--top-p", type=float)
    sampling_group.add_argument("--top-k", type=int)
    return parser


def main(args: dict):
    # Pop arguments not used by LLM
    max_tokens = args.pop("max_tokens")
    temperature = args.pop("temperature")
    top_p = args.pop("top_p")
    top_k = args.pop("top_k")

    # Create an LLM
    llm = LLM(**args)

    # Create a sampling params object
    sampling_params = llm.get_default_sampling_params()
    if max_tokens is not None:
        sampling_params.max_tokens = max_tokens
    if temperature is not None:
        sampling_params.temperature = temperature
    if top_p is not None:
        sampling_params.top_p = top_p
    if top_k is not None:
        sampling_params.top_k = top_k

    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
               "The future of AI is"]
    outputs = llm.generate(prompts, sampling_params)
    print("-" * 60)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}\\nOutput: {output.outputs[0].text!r}\\nTokens: {len(output.outputs[0].token_ids)}")
        print("-" * 60)


if __name__ == "__main__":
    parser = create_parser()
    args: dict = vars(parser.parse_args())
    main(args)
'''

OFFLINE_INFERENCE_WITH_ENGINE_ARGS = '''
import dataclasses

from nano_infer import LLM, SamplingParams
from nano_infer.engine.arg_utils import EngineArgs
from nano_infer.utils import FlexibleArgumentParser

parser = FlexibleArgumentParser()
parser = EngineArgs.add_cli_args(parser)
args = parser.parse_args()
engine_args = EngineArgs.from_cli_args(args)
llm = LLM(**dataclasses.asdict(engine_args))

prompts = ["Hello, my name is", "The capital of France is"]
sampling_params = SamplingParams(temperature=0.0, max_tokens=6)
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")
print(f"max_model_len: {llm.engine.max_model_len}, prefix cache: {llm.engine.config.prefix_cache}")
'''

LLM_ENGINE_EXAMPLE = '''
from nano_infer import EngineArgs, LLMEngine, RequestOutput, SamplingParams
from nano_infer.utils.argparse_utils import FlexibleArgumentParser


def create_test_prompts() -> list[tuple[str, SamplingParams]]:
    """Create a list of test prompts with their sampling parameters."""
    return [
        ("A robot may not injure a human being", SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1)),
        ("To be or not to be,", SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2)),
        ("What is the meaning of life?", SamplingParams(n=2, temperature=0.8, top_p=0.95, frequency_penalty=0.1)),
    ]


def process_requests(engine: LLMEngine, test_prompts: list[tuple[str, SamplingParams]]):
    """Continuously process a list of prompts and handle the outputs."""
    request_id = 0

    print("-" * 50)
    while test_prompts or engine.has_unfinished_requests():
        if test_prompts:
            prompt, sampling_params = test_prompts.pop(0)
            engine.add_request(str(request_id), prompt, sampling_params)
            request_id += 1

        request_outputs: list[RequestOutput] = engine.step()

        for request_output in request_outputs:
            if request_output.finished:
                print(f"finished {request_output.request_id}: {len(request_output.outputs)} output(s), "
                      f"{len(request_output.outputs[0].token_ids)} tokens")
                print("-" * 50)


def initialize_engine(args) -> LLMEngine:
    """Initialize the LLMEngine from the command line arguments."""
    engine_args = EngineArgs.from_cli_args(args)
    return LLMEngine.from_engine_args(engine_args)


def parse_args():
    parser = FlexibleArgumentParser(description="Demo on using the LLMEngine class directly")
    parser = EngineArgs.add_cli_args(parser)
    return parser.parse_args()


def main(args):
    """Main function that sets up and runs the prompt processing."""
    engine = initialize_engine(args)
    test_prompts = create_test_prompts()
    process_requests(engine, test_prompts)


if __name__ == "__main__":
    args = parse_args()
    main(args)
'''

REPRODUCIBILITY = '''
from nano_infer import LLM, SamplingParams

# The engine's seed seeds its random generator once: a script that samples without per-request seeds then
# prints the same text each time it runs.
SEED = 42

prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is"]


def print_outputs(llm: LLM):
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12)
    outputs = llm.generate(prompts, sampling_params)
    print("-" * 50)
    for output in outputs:
        print(f"Prompt: {output.prompt!r}\\nGenerated text: {output.outputs[0].text!r}")
        print("-" * 50)


def main():
    llm = LLM(model=MODEL, seed=SEED, max_model_len=256)
    print_outputs(llm)


if __name__ == "__main__":
    main()
'''

PREFIX_CACHING = '''
from nano_infer import LLM, SamplingParams
from nano_infer.distributed import cleanup_dist_env_and_memory

# Common prefix.
prefix = (
    "You are an expert school principal, skilled in effectively managing "
    "faculty and staff. Draft 10-15 questions for a potential first grade "
    "Head Teacher for my K-12, all-girls', independent school that emphasizes "
    "community, joyful discovery, and life-long learning. The candidate is "
    "coming in for a first-round panel interview for a 8th grade Math "
    "teaching role. They have 5 years of previous teaching experience "
    "as an assistant teacher at a co-ed, public school with experience "
    "in middle school math teaching. Based on these information, fulfill "
    "the following paragraph: "
)

# Sample prompts.
prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]

generating_prompts = [prefix + prompt for prompt in prompts]

# Create a sampling params object.
sampling_params = SamplingParams(temperature=0.0, max_tokens=8)


def main():
    # Create an LLM without prefix caching as a baseline.
    regular_llm = LLM(model=MODEL, gpu_memory_utilization=0.4, enable_prefix_caching=False, max_model_len=512)

    print("Results without `enable_prefix_caching`")

    # ruff: noqa: E501
    # Generate texts from the prompts. The output is a list of RequestOutput objects
    # that contain the prompt, generated text, and other information.
    outputs = regular_llm.generate(generating_prompts, sampling_params)

    regular_generated_texts = []
    # Print the outputs.
    print("-" * 50)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        regular_generated_texts.append(generated_text)
        print(f"Prompt: {prompt!r}\\nGenerated text: {generated_text!r}")
        print("-" * 50)

    # Destroy the LLM object and free up the GPU memory.
    del regular_llm
    cleanup_dist_env_and_memory()

    # Create an LLM with prefix caching enabled.
    prefix_cached_llm = LLM(model=MODEL, enable_prefix_caching=True, gpu_memory_utilization=0.4, max_model_len=512)

    # Warmup so that the shared prompt's KV cache is computed.
    prefix_cached_llm.generate(generating_prompts[0], sampling_params)

    # Generate with prefix caching.
    outputs = prefix_cached_llm.generate(generating_prompts, sampling_params)

    print("Results with `enable_prefix_caching`")

    cached_generated_texts = []
    # Print the outputs. You should see the same outputs as before.
    print("-" * 50)
    for output in outputs:
        prompt = output.prompt
        generated_text = output.outputs[0].text
        cached_generated_texts.append(generated_text)
        print(f"Prompt: {prompt!r}\\nGenerated text: {generated_text!r}")
        print("-" * 50)

    # Compare the results and display the speedup
    generated_same = all(
        regular_generated_texts[i] == cached_generated_texts[i]
        for i in range(len(prompts))
    )
    print(f"Generated answers are the same: {generated_same}")
    print(f"Cached prompt tokens: {min(o.num_cached_tokens for o in outputs)}")

    # This project's addition: after new weights, the cached prefixes are stale; reset_prefix_cache drops them.
    print(f"Prefix cache reset: {prefix_cached_llm.reset_prefix_cache()}")
    outputs = prefix_cached_llm.generate(generating_prompts[0], sampling_params)
    print(f"Cached prompt tokens after the reset: {outputs[0].num_cached_tokens}")


if __name__ == "__main__":
    main()
'''


def run_example(source: str, *argv: str) -> str:
    """Run a script as __main__ with `argv` on its command line; what it printed."""
    out, saved = io.StringIO(), sys.argv
    sys.argv = ["example.py", *argv]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "example.py", "exec"), {"__name__": "__main__", "MODEL": str(TINY_MODEL_DIR)})
    finally:
        sys.argv = saved
    return out.getvalue()


def test_basic_generate_builds_its_llm_from_engine_args_flags_with_underscores_and_equals():
    printed = run_example(BASIC_GENERATE, "--max_model_len=128", "--max-num-seqs", "8", "--max_tokens=5",
                          "--temperature", "0", "--no-enable-prefix-caching")
    assert printed.count("Prompt: ") == 4 and printed.count("Tokens: 5") == 4, printed


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
    assert cached >= 96  # the ~130-token prefix, in whole blocks of 16
    assert "Prefix cache reset: True" in printed and "Cached prompt tokens after the reset: 0" in printed
