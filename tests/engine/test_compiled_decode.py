"""The CPU decode step through torch.compile (engine/compiled_decode.py): when it is on, that its numbers are the
eager step's, and that nothing a running engine does makes it compile again.

Parity with transformers in float32 is in tests/helpers/parity.py's CONFIGS (enforce_eager=False). Here: the
bfloat16 int4 path a GGUF chat takes, against the eager engine on the same weights.
"""
import re

import pytest
import torch
from torch._dynamo.utils import counters

from nano_infer import LLM, SamplingParams
from nano_infer.engine.compiled_decode import BATCH_BUCKETS, ENV, CompiledDecode, wants_compiled_decode
from nano_infer.models.quantization import Int4Linear

# prompts of 3, 9 and 17 tokens: with blocks of 4 the tables grow from 1 to 12 blocks while they decode
PROMPTS = [[5 + i for i in range(n)] for n in (3, 9, 17)]
PARAMS = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2)


def engine(enforce_eager):
    return LLM(dtype="bfloat16", quantization="int4", enforce_eager=enforce_eager, block_size=4, max_model_len=128,
               kv_cache_memory=8 << 20)


def replies(llm, prompts):
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=PARAMS, use_tqdm=False)
    return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
            for o in outs]


def test_by_default_only_an_engine_of_4_or_8_bit_weights_on_a_cpu_compiles(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    quantized, dense = type("M", (), {"quantization": "gguf"})(), type("M", (), {"quantization": "none"})()
    assert wants_compiled_decode(None, cpu, quantized)
    assert not wants_compiled_decode(None, cpu, dense)  # float32 and plain bfloat16: eager unless asked
    assert wants_compiled_decode(False, cpu, dense)
    assert not wants_compiled_decode(True, cpu, quantized)
    assert not wants_compiled_decode(None, cuda, quantized) and not wants_compiled_decode(False, cuda, dense)
    monkeypatch.setenv(ENV, "0")
    assert not wants_compiled_decode(None, cpu, quantized) and wants_compiled_decode(False, cpu, quantized)

    monkeypatch.setenv(ENV, "1")
    llm = engine(None)
    assert isinstance(llm.engine.runner.graphs, CompiledDecode)
    assert "decode steps of up to 4 sequences compiled by torch.compile" in llm.engine.startup_line
    assert engine(True).engine.runner.graphs is None
    assert LLM(dtype="bfloat16", quantization="int4", attention="blockwise", max_model_len=64).engine.runner.graphs is None
    assert LLM(dtype="float32", max_model_len=64).engine.runner.graphs is None


def test_compiled_steps_give_the_eager_steps_numbers_and_compile_once_per_bucket():
    eager, compiled = engine(True), engine(False)
    steps = compiled.engine.runner.graphs
    steps.warm_up()  # what a server does before it listens: writes block 0's first slot, which no table reads unmasked
    assert set(steps.compile_seconds) == set(BATCH_BUCKETS)
    graphs = counters["stats"]["unique_graphs"]

    torch.set_num_threads(1)  # the free-core plug-in changes the count between steps: no new compile
    try:
        ours, theirs = replies(compiled, PROMPTS[:1]) + replies(compiled, PROMPTS), \
            replies(eager, PROMPTS[:1]) + replies(eager, PROMPTS)
    finally:
        torch.set_num_threads(2)
    assert [t for t, _ in ours] == [t for t, _ in theirs]
    # emulate_precision_casts rounds where eager rounds: the same logprobs but for a rare bfloat16 step flipped by
    # the padded batch's attention (4 rows for 3 sequences, a wider table summed in another order)
    diffs = [abs(a[t] - b[t]) for (_, x), (_, y) in zip(ours, theirs) for a, b in zip(x, y) for t in a if t in b]
    assert max(diffs) <= 0.05
    assert sum(d == 0 for d in diffs) >= 0.95 * len(diffs)

    # six sequences decode eagerly and give every int4 layer its dense copy: the compiled steps' guards do not
    # read the modules, so the steps of fewer sequences after them run the same graphs
    six = [[7 + i for i in range(n)] for n in (2, 4, 6, 8, 10, 12)]
    assert [t for t, _ in replies(compiled, six)] == [t for t, _ in replies(eager, six)]
    assert all(m.dense is not None for m in compiled.engine.model.modules() if isinstance(m, Int4Linear))
    assert [t for t, _ in replies(compiled, PROMPTS)] == [t for t, _ in theirs[1:]]
    assert counters["stats"]["unique_graphs"] == graphs



def test_without_a_cxx_compiler_the_engine_decodes_eagerly_and_says_so(monkeypatch, caplog):
    import nano_infer.engine.build as build

    monkeypatch.setattr(build, "cxx_compiler", lambda: None)
    with caplog.at_level("WARNING", logger="nano_infer"):
        llm = engine(False)
    assert llm.engine.runner.graphs is None
    assert "torch.compile needs a C++ compiler and Python's headers" in caplog.text
    assert "compiled by torch.compile" not in llm.engine.startup_line


def test_two_engines_in_one_process_each_run_their_own_graph():
    """The guards read nothing through the step's `self`: a second engine (other weights, another pool) must
    still compile its own graph, not run the first one's."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first = engine(False)
    first.generate(prompt_token_ids=PROMPTS[:1], sampling_params=params, use_tqdm=False)
    # other layers: int8 weights where the first engine's graph calls the int4 kernel
    other = LLM(dtype="bfloat16", quantization="int8", enforce_eager=False, block_size=4, max_model_len=128,
                kv_cache_memory=8 << 20)
    ours = other.generate(prompt_token_ids=PROMPTS[1:2], sampling_params=params, use_tqdm=False)  # bucket 1 again
    theirs = LLM(dtype="bfloat16", quantization="int8", enforce_eager=True, block_size=4, max_model_len=128,
                 kv_cache_memory=8 << 20).generate(prompt_token_ids=PROMPTS[1:2], sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in theirs]
    assert other.engine.runner.graphs.compile_seconds  # it compiled (a graph of its own)


def test_compile_sizes_build_a_batch_bucket_with_the_dense_copies_and_give_the_eager_tokens():
    """vLLM's compilation_config={"compile_sizes": [...]}: a bucket of 8 sequences, traced after warm_up made the
    int4 layers' dense copies (a step of that many rows runs on them), runs six sequences as eager would."""
    llm = LLM(dtype="bfloat16", quantization="int4", block_size=4, max_model_len=128, kv_cache_memory=8 << 20,
              compilation_config={"compile_sizes": [8, 1]})
    steps = llm.engine.runner.graphs
    assert steps.batch_sizes == (1, 8) and "batch sizes 1, 8" in llm.engine.startup_line
    assert all(m.dense is None for m in llm.engine.model.modules() if isinstance(m, Int4Linear))
    steps.warm_up()
    assert set(steps.compile_seconds) == {1, 8}
    assert all(m.dense is not None for m in llm.engine.model.modules() if isinstance(m, Int4Linear))
    batches = []
    run = steps.run
    steps.run = lambda step: batches.append(len(step.decodes[0][2])) or run(step)
    six = [[7 + i for i in range(n)] for n in (2, 4, 6, 8, 10, 12)]
    ours = [t for t, _ in replies(llm, six)]
    assert batches and max(batches) == 6  # the steps of six sequences ran compiled, in the bucket of 8
    assert ours == [t for t, _ in replies(engine(True), six)]


@pytest.mark.parametrize("options, message", [
    (dict(compilation_config={"compile_sizes": [1, 2], "level": 3}), "the one key taken here is 'compile_sizes'"),
    (dict(compilation_config=3), "the one key taken here is 'compile_sizes'"),
    (dict(compilation_config={"compile_sizes": [0, 4]}), "must be a list of batch sizes >= 1"),
    (dict(compilation_config={"compile_sizes": []}), "must be a list of batch sizes >= 1"),
    (dict(compilation_config={"compile_sizes": [8]}, max_num_seqs=4), "more sequences than a step holds"),
    (dict(compilation_config={"compile_sizes": [8]}, enforce_eager=True), "set one or the other"),
    (dict(compilation_config={"compile_sizes": [8]}, attention="blockwise"), "got attention='blockwise'"),
    (dict(compilation_config={"compile_sizes": [8]}, kv_cache_dtype="int8"), "got kv_cache_dtype='int8'"),
])
def test_compile_sizes_that_cannot_be_honoured_are_refused_with_the_reason(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LLM(dtype="bfloat16", quantization="int4", max_model_len=64, **options)


def test_compile_sizes_for_a_mixture_of_experts_model_are_refused_before_its_weights_load(tmp_path):
    from tests.helpers.model_factory import make_moe_dir, make_tokenizer

    folder = make_moe_dir("mixtral", tmp_path, make_tokenizer(tmp_path / "tok"))
    with pytest.raises(ValueError, match="a Mixture-of-Experts model"):
        LLM(str(folder), dtype="float32", max_model_len=64, compilation_config={"compile_sizes": [8]})
