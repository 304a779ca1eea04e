"""ModelRunner.prepare: how one scheduled step is packed into tensors.

The attention code relies on a layout: decodes first, sorted by context length, cut into
batches that are contiguous runs of rows; prefill chunks after them. These tests check that
layout, and that every token still lands at its own position, slot and logit row.
"""
import torch

from nano_infer.kv import KVPool
from nano_infer.engine.model_runner import ModelRunner
from nano_infer.sampling_params import SamplingParams
from nano_infer.core.batch import ScheduledSeq
from nano_infer.core.sequence import Sequence

BS = 4


def seq(name, num_tokens, num_computed, table):
    s = Sequence(name, list(range(1000 * len(name), 1000 * len(name) + num_tokens)), SamplingParams(max_tokens=1))
    s.num_computed_tokens = num_computed
    s.block_table = table
    return s


def test_decodes_first_in_length_order_then_prefills_logits_in_scheduled_order():
    pool = KVPool(1, 64, BS, 2, 8, torch.float32, torch.device("cpu"))
    prompt = seq("p", 9, 0, [3, 4, 5])  # whole prompt in one chunk: samples
    chunk = seq("cc", 30, 12, [6, 7, 8, 9, 10, 11, 12, 13])  # tokens 12..16 of a 30-token prompt: no logits
    long_ = seq("ddd", 51, 50, [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32])
    short = seq("dddd", 8, 7, [40, 41])
    mid = seq("ddddd", 31, 30, [50, 51, 52, 53, 54, 55, 56, 57])
    scheduled = [(prompt, 9), (long_, 1), (chunk, 5), (short, 1), (mid, 1)]
    runner = ModelRunner(None, pool, "gather", BS, torch.device("cpu"))
    runner.decode_batch = 2
    ids, pos, meta, sample_rows = runner.prepare([ScheduledSeq(s, s.num_computed_tokens, n) for s, n in scheduled])

    layout = [short, mid, long_, prompt, chunk]  # decodes by context length, then prefills in scheduled order
    counts = {id(short): 1, id(mid): 1, id(long_): 1, id(prompt): 9, id(chunk): 5}
    row, first_row = 0, {}
    for s in layout:
        n, start = counts[id(s)], s.num_computed_tokens
        first_row[id(s)] = row
        assert ids[row : row + n].tolist() == s.token_ids[start : start + n]
        assert pos[row : row + n].tolist() == list(range(start, start + n))
        slots = [s.block_table[p // BS] * BS + p % BS for p in range(start, start + n)]
        assert meta.slot_mapping[row : row + n].tolist() == slots
        row += n
    assert row == len(ids)

    # one logit row per sequence that reaches its last token, in scheduled order; the mid-prompt chunk has none
    assert sample_rows == [first_row[id(s)] + counts[id(s)] - 1 for s in (prompt, long_, short, mid)]

    # decode batches: contiguous rows, block tables cut to the longest context, mask hides the rest
    assert [(d.start, d.end) for d in meta.decodes] == [(0, 2), (2, 3)]
    first, second = meta.decodes
    assert first.context_lens.tolist() == [8, 31] and second.context_lens.tolist() == [51]
    assert first.block_tables.tolist() == [[40, 41, 0, 0, 0, 0, 0, 0], [50, 51, 52, 53, 54, 55, 56, 57]]
    assert second.block_tables.tolist() == [long_.block_table]
    for d in meta.decodes:
        visible = d.mask.view(d.end - d.start, -1) == 0
        assert visible.sum(-1).tolist() == d.context_lens.tolist()
        assert torch.isneginf(d.mask).sum() == visible.numel() - visible.sum()
        assert all(visible[i, : int(n)].all() for i, n in enumerate(d.context_lens))

    # prefills: block tables cover exactly their context
    assert [(p.q_start, p.q_len, p.context_len) for p in meta.prefills] == [(3, 9, 9), (12, 5, 17)]
    assert [p.block_table.tolist() for p in meta.prefills] == [[3, 4, 5], [6, 7, 8, 9, 10]]
