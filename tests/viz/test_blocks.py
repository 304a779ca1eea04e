"""The block-table heatmap shows who holds which physical block, with reference counts."""
import math

import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.viz.blocks import block_events_figure, block_table_figure, block_table_stepper, blocks_in_use

PROMPT_LEN, BS = 19, 4  # 19 tokens: four full blocks and a partly filled fifth, shared by the forks


@pytest.fixture(scope="module")
def forked(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", kv_cache="paged", block_size=BS, num_kv_blocks=24, prefix_cache=None,
              record_steps=True, log_blocks=True, max_model_len=256)
    prompt = [(5 * i) % 200 + 3 for i in range(PROMPT_LEN)]
    llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=6, ignore_eos=True))
    return llm.engine.history, llm.engine.kv.blocks.log


def _cells(fig):
    heat = fig.data[0]
    return heat.y, heat.z, heat.text


def test_fork_shows_one_block_in_three_rows_with_ref_count_three(forked):
    history, _ = forked
    labels, z, text = _cells(block_table_figure(history[0], num_blocks=10))
    assert list(labels) == ["pool (ref count)", "seq 0/0", "seq 0/1", "seq 0/2"]
    table = history[0].block_tables["0/0"]
    assert len(table) == math.ceil(PROMPT_LEN / BS)
    for row in (1, 2, 3):
        held = [b for b, v in enumerate(z[row]) if v is not None]
        assert held == sorted(table)
        assert all(z[row][b] == 3 for b in held)
        assert [text[row][b] for b in table] == [str(i) for i in range(len(table))]  # logical index
    assert [b for b, n in enumerate(z[0]) if n] == sorted(table)  # pool row: only these are taken


def test_copy_on_write_moves_the_partial_block(forked):
    history, _ = forked
    _, z, _ = _cells(block_table_figure(history[1], num_blocks=blocks_in_use(history)))
    last = math.ceil(PROMPT_LEN / BS) - 1
    still_shared = [row for row in (1, 2, 3) if z[row][last] is not None]
    assert len(still_shared) == 1 and z[still_shared[0]][last] == 1  # two copied, one kept the original
    assert all(z[row][b] == 3 for row in (1, 2, 3) for b in range(last))  # full blocks stay shared


def test_events_figure_has_one_marker_per_logged_event(forked):
    _, log = forked
    fig = block_events_figure(log)
    markers = {t.name: len(t.x) for t in fig.data if t.mode == "markers"}
    assert markers == {op: sum(e.op == op for e in log) for op in markers}
    assert sum(markers.values()) == len(log)
    assert markers["cow"] == 2 and markers["share"] == 2 * math.ceil(PROMPT_LEN / BS)


def test_stepper_has_one_frame_per_step_drawn_like_the_single_figure(forked):
    history, _ = forked
    fig = block_table_stepper(history)
    columns = blocks_in_use(history)
    assert len(fig.frames) == len(history)
    assert [s.label for s in fig.layout.sliders[0].steps] == [str(r.step) for r in history]
    for frame, record in zip(fig.frames, history):
        single = block_table_figure(record, columns)
        assert frame.data[0].z == single.data[0].z and frame.data[0].y == single.data[0].y
        assert frame.layout.title.text == single.layout.title.text
    assert fig.data[0].z == fig.frames[0].data[0].z  # what a viewer sees before touching the slider
