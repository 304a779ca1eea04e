"""The memory figures draw what the engine recorded: reserved and used bytes per step."""
import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.viz.memory import kv_memory_figure, kv_utilization, peak_reserved_bytes, step_time_figure

PROMPT_LEN, MAX_TOKENS, BS = 21, 12, 8


@pytest.fixture(scope="module")
def runs(qwen2_dir):
    """One request, fixed lengths, on both caches: every record's bytes are known in advance."""
    prompt = [(7 * i) % 300 + 3 for i in range(PROMPT_LEN)]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {}
    for kind in ("contiguous", "paged"):
        llm = LLM(str(qwen2_dir), dtype="float32", kv_cache=kind, block_size=BS, prefix_cache=None, record_steps=True, max_model_len=256)
        llm.generate(prompt_token_ids=[prompt], sampling_params=params)
        out[kind] = (llm.engine.history, llm.engine.kv_bytes_per_token)
    return out


def test_utilization_matches_the_block_arithmetic(runs):
    history, per_token = runs["paged"]
    # after step i the sequence has PROMPT_LEN + i tokens computed, in ceil(len / BS) blocks;
    # the last step finishes it, and a finished sequence holds nothing
    lengths = [PROMPT_LEN + i for i in range(MAX_TOKENS - 1)]
    used = sum(lengths)
    reserved = sum(-(-n // BS) * BS for n in lengths)
    assert [r.kv_used_bytes for r in history[:-1]] == [n * per_token for n in lengths]
    assert kv_utilization(history) == pytest.approx(used / reserved)
    assert peak_reserved_bytes(history) == -(-lengths[-1] // BS) * BS * per_token


def test_contiguous_reserves_the_whole_context(runs):
    history, per_token = runs["contiguous"]
    assert peak_reserved_bytes(history) == 256 * per_token
    assert kv_utilization(history) < kv_utilization(runs["paged"][0])


def test_memory_figure_has_reserved_and_used_per_run(runs):
    histories = {kind: h for kind, (h, _) in runs.items()}
    fig = kv_memory_figure(histories)
    assert [t.name for t in fig.data] == ["reserved", "used (holds a token)"] * 2
    assert [t.showlegend for t in fig.data] == [True, True, False, False]  # one legend entry per meaning
    paged_reserved, paged_used = fig.data[2], fig.data[3]
    assert paged_reserved.xaxis == "x2"  # second panel
    scale = runs["paged"][0][0].kv_used_bytes / paged_used.y[0]  # bytes per plotted unit
    assert scale in (1, 1024, 1024**2, 1024**3)
    assert [y * scale for y in paged_reserved.y] == [r.kv_reserved_bytes for r in histories["paged"]]
    assert [y * scale for y in paged_used.y] == [r.kv_used_bytes for r in histories["paged"]]
    assert list(paged_used.x) == list(range(len(histories["paged"])))


def test_step_time_figure_plots_milliseconds():
    fig = step_time_figure({"none": ([16, 32], [0.002, 0.004]), "cached": ([16, 32], [0.001, 0.001])})
    assert [t.name for t in fig.data] == ["none", "cached"]
    assert list(fig.data[0].y) == pytest.approx([2.0, 4.0])
    assert list(fig.data[0].x) == [16, 32]
