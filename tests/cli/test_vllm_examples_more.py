"""More of vLLM's offline examples, in their shape, with only the import (`vllm` -> `nano_infer`) and the model changed.

This project's own scripts making the calls vLLM's examples make (basic/chat.py, metrics.py, the AsyncLLM
streaming example, logits_processor/custom.py, structured_outputs.py), from the module paths they import
(`nano_infer.v1.metrics.reader`, `nano_infer.v1.engine.async_llm`, `nano_infer.v1.sample.logits_processor`,
`nano_infer.sampling_params`, `nano_infer.engine.arg_utils`). Each runs as `__main__` (run_example, from
test_vllm_examples.py) and the tests read what it printed. The model is the one shipped in the package.
"""
import json
import re

import pytest
from pydantic import BaseModel
from transformers import AutoTokenizer

from nano_infer.models.loader import TINY_MODEL_DIR
from tests.cli.test_vllm_examples import LINES, run_example

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CHAT = '''
from nano_infer import LLM, EngineArgs
from nano_infer.utils.argparse_utils import FlexibleArgumentParser


def flags():
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(model=MODEL)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--chat-template-path", type=str)
    return parser


def show(outputs):
    for out in outputs:
        print(f"Prompt: {out.prompt!r}, Generated text: {out.outputs[0].text!r}")
    print("=" * 40)


def run(options: dict):
    max_tokens, temperature = options.pop("max_tokens"), options.pop("temperature")
    template_path = options.pop("chat_template_path")
    llm = LLM(**options)
    params = llm.get_default_sampling_params()
    if max_tokens is not None:
        params.max_tokens = max_tokens
    if temperature is not None:
        params.temperature = temperature
    conversation = [
        {"role": "system", "content": "You answer in verse."},
        {"role": "user", "content": "Good morrow"},
        {"role": "assistant", "content": "Good morrow to you. What would you hear?"},
        {"role": "user", "content": "A line about the sea."},
    ]
    show(llm.chat(conversation, params, use_tqdm=False))
    conversations = [conversation[:2], conversation, conversation[:2] + [{"role": "assistant", "content": "Hail"}]]
    show(llm.chat(conversations, params, use_tqdm=True))
    if template_path is not None:
        with open(template_path) as f:
            template = f.read()
        show(llm.chat(conversations, params, use_tqdm=False, chat_template=template))


if __name__ == "__main__":
    run(vars(flags().parse_args()))
'''

METRICS = '''
from nano_infer import LLM, SamplingParams
from nano_infer.v1.metrics.reader import Counter, Gauge, Histogram, Vector

params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=6, ignore_eos=True)

if __name__ == "__main__":
    llm = LLM(model=MODEL, disable_log_stats=False)
    for out in llm.generate(LINES, params):
        print(f"Prompt: {out.prompt!r} Generated text: {out.outputs[0].text!r}")
    for metric in llm.get_metrics():
        if isinstance(metric, Gauge):
            print(f"{metric.name} (gauge) = {metric.value}")
        elif isinstance(metric, Counter):
            print(f"{metric.name} (counter) = {metric.value} {metric.labels.get('finished_reason', '')}".rstrip())
        elif isinstance(metric, Vector):
            print(f"{metric.name} (vector) = {metric.values}")
        elif isinstance(metric, Histogram):
            print(f"{metric.name} (histogram) sum = {metric.sum} count = {metric.count}")
            for le, count in metric.buckets.items():
                print(f"    {le}: {count}")
'''

ASYNC_STREAMING = '''
import asyncio

from nano_infer import SamplingParams
from nano_infer.engine.arg_utils import AsyncEngineArgs
from nano_infer.sampling_params import RequestOutputKind
from nano_infer.v1.engine.async_llm import AsyncLLM


async def stream(engine: AsyncLLM, prompt: str, request_id: str, kind: RequestOutputKind) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True, output_kind=kind)
    print(f"{request_id} prompt: {prompt!r}")
    async for output in engine.generate(request_id=request_id, prompt=prompt, sampling_params=params):
        for completion in output.outputs:
            print(f"{request_id} piece: {completion.text!r}")
        if output.finished:
            print(f"{request_id} done")


async def main():
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, enforce_eager=True))
    try:
        for i, prompt in enumerate(LINES[:2]):
            await stream(engine, prompt, f"stream-{i}", RequestOutputKind.DELTA)
        await stream(engine, LINES[0], "whole", RequestOutputKind.FINAL_ONLY)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
'''

CUSTOM_LOGITS_PROCESSOR = '''
import torch

from nano_infer import LLM, SamplingParams
from nano_infer.config import VllmConfig
from nano_infer.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class OnlyTarget(LogitsProcessor):
    """A request with extra_args["target_token"] can produce nothing but that token; the rest are left alone."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.target_of_row: dict[int, int] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is most likely

    def update_state(self, batch_update: BatchUpdate | None):
        if batch_update is None:
            return
        for row, params, _prompt_ids, _output_ids in batch_update.added:
            target = (params.extra_args or {}).get("target_token")
            if target is None:
                self.target_of_row.pop(row, None)
            else:
                self.target_of_row[row] = target
        for row in batch_update.removed:
            self.target_of_row.pop(row, None)
        for a, b, how in batch_update.moved:
            at_a, at_b = self.target_of_row.pop(a, None), self.target_of_row.pop(b, None)
            if at_a is not None:
                self.target_of_row[b] = at_a
            if how is MoveDirectionality.SWAP and at_b is not None:
                self.target_of_row[a] = at_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.target_of_row:
            return logits
        rows = torch.tensor(list(self.target_of_row), dtype=torch.long)
        targets = torch.tensor(list(self.target_of_row.values()), dtype=torch.long)
        kept = logits[rows, targets]
        logits[rows] = float("-inf")
        logits[rows, targets] = kept
        return logits


if __name__ == "__main__":
    params = [SamplingParams(temperature=0.0, max_tokens=8, extra_args={"target_token": 67} if i % 2 else None)
              for i in range(len(LINES))]
    llm = LLM(model=MODEL, logits_processors=[OnlyTarget])
    for out in llm.generate(LINES, params):
        print(f"Prompt: {out.prompt!r} Output ids: {list(out.outputs[0].token_ids)}")
'''

STRUCTURED_OUTPUTS = '''
import json
from enum import Enum

from pydantic import BaseModel, Field

from nano_infer import LLM, SamplingParams
from nano_infer.sampling_params import StructuredOutputsParams


class Colour(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Flag(BaseModel):
    country: str = Field(max_length=8)  # a bound, so that a small model's string ends
    stripes: int = Field(ge=0, le=20)
    colour: Colour


SQL = """
root ::= query
query ::= "SELECT " field " FROM " table " WHERE " field " = " digit
field ::= "name" | "age"
table ::= "people" | "pets"
digit ::= [0-9]
"""
TAG = {"structures": [{"begin": " the <city>", "schema": {"enum": ["Rome", "Athens", "Verona"]}, "end": "</city>"}],
       "triggers": [" the"]}  # once the model writes " the", it must go on: " <city>", a city as JSON, "</city>"
ASKS = {
    "choice": ("Is the sea wet? Answer:", StructuredOutputsParams(choice=["yes", "no", "perhaps"])),
    "regex": ("An address for the prompter:", StructuredOutputsParams(regex=r"[a-z]{2,8}\\.[a-z]{2,8}@[a-z]{2,8}\\.com\\n")),
    "json": ("A flag as JSON:", StructuredOutputsParams(json=Flag.model_json_schema())),
    "grammar": ("A query:", StructuredOutputsParams(grammar=SQL)),
    "structural_tag": ("Say where the players go:", StructuredOutputsParams(structural_tag=json.dumps(TAG))),
}

if __name__ == "__main__":
    llm = LLM(model=MODEL, max_model_len=160)
    for name, (prompt, constraint) in ASKS.items():
        params = SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=constraint,
                                stop=["\\n"] if name == "regex" else None, include_stop_str_in_output=name == "regex")
        print(f"{name}: {llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].text!r}")
'''


def test_chat_renders_conversations_with_the_model_template_or_the_one_given(tmp_path):
    template = tmp_path / "verse.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] | upper }}] {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[ASSISTANT] {% endif %}")
    printed = run_example(CHAT, "--max-tokens", "4", "--temperature=0", "--max_model_len", "256",
                          "--chat-template-path", str(template))
    blocks = [b.strip().splitlines() for b in printed.split("=" * 40)][:3]
    assert [len(b) for b in blocks] == [1, 3, 3], printed
    own = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    first = own.apply_chat_template([{"role": "system", "content": "You answer in verse."},
                                     {"role": "user", "content": "Good morrow"}], add_generation_prompt=True, tokenize=False)
    assert blocks[1][0].startswith(f"Prompt: {first!r}, Generated text: ")
    assert blocks[0][0] == blocks[1][1]  # one conversation alone or in a batch: the same greedy reply
    assert all(line.startswith("Prompt: '[SYSTEM] You answer in verse.\\n[USER] Good morrow\\n") for line in blocks[2])
    assert blocks[2][1].split(", Generated text: ")[0].endswith("[USER] A line about the sea.\\n[ASSISTANT] '")


def test_metrics_reads_vllm_counters_gauges_and_histograms_after_generate():
    printed = run_example(METRICS)
    prompt_tokens = sum(len(AutoTokenizer.from_pretrained(TINY_MODEL_DIR)(line)["input_ids"]) for line in LINES)
    assert f"vllm:prompt_tokens (counter) = {prompt_tokens}\n" in printed, printed
    assert "vllm:generation_tokens (counter) = 24\n" in printed  # 4 prompts x 6 tokens
    assert "vllm:request_success (counter) = 4 length\n" in printed and "vllm:request_success (counter) = 0 stop\n" in printed
    assert "vllm:num_requests_running (gauge) = 0.0" in printed and "vllm:kv_cache_usage_perc (gauge)" in printed
    latency = printed.split("vllm:e2e_request_latency_seconds (histogram) ")[1].splitlines()
    assert latency[0].endswith("count = 4"), latency
    buckets = [line.strip() for line in latency[1:] if line.startswith("    ")]
    assert buckets[-1] == "+Inf: 4" and [int(b.split(": ")[1]) for b in buckets] == sorted(int(b.split(": ")[1]) for b in buckets)


def test_async_streaming_prints_each_delta_once_and_they_join_into_the_whole_reply():
    printed = run_example(ASYNC_STREAMING).splitlines()
    pieces = {rid: [eval(line.split(" piece: ")[1]) for line in printed if line.startswith(f"{rid} piece: ")]
              for rid in ("stream-0", "stream-1", "whole")}
    assert "stream-0 done" in printed and "stream-1 done" in printed and "whole done" in printed
    assert len(pieces["whole"]) == 1 and 1 < len(pieces["stream-0"]) <= 12  # deltas, not the text so far
    assert "".join(pieces["stream-0"]) == pieces["whole"][0]  # the same prompt and seed, as one final output


def test_custom_logits_processor_forces_the_target_only_for_requests_that_name_one():
    printed = run_example(CUSTOM_LOGITS_PROCESSOR)
    ids = [json.loads(line.split("Output ids: ")[1]) for line in printed.splitlines()]
    assert len(ids) == 4 and ids[1] == ids[3] == [67] * 8, printed
    assert ids[0] != [67] * 8 and ids[2] != [67] * 8


class FlagRecord(BaseModel):
    country: str
    stripes: int
    colour: str


def test_structured_outputs_choice_regex_pydantic_json_grammar_and_structural_tag():
    printed = dict(line.split(": ", 1) for line in run_example(STRUCTURED_OUTPUTS).splitlines())
    got = {name: eval(text) for name, text in printed.items()}
    assert got["choice"] in ("yes", "no", "perhaps")
    assert re.fullmatch(r"[a-z]{2,8}\.[a-z]{2,8}@[a-z]{2,8}\.com\n", got["regex"]), got
    flag = FlagRecord.model_validate_json(got["json"])
    assert flag.colour in ("red", "green", "blue")
    assert re.fullmatch(r"SELECT (name|age) FROM (people|pets) WHERE (name|age) = [0-9]", got["grammar"]), got
    for tagged in got["structural_tag"].split(" the")[1:]:  # after every trigger: the begin, an object, the end
        body = re.match(r" <city>(.*?)</city>", tagged)
        assert body and json.loads(body.group(1)) in ("Rome", "Athens", "Verona"), got
    assert " the <city>" in got["structural_tag"], got  # the trigger came, so the constraint was exercised
