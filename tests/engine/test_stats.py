"""The engine's published stats: what the server's threads read instead of the engine's own objects."""
import dataclasses

import pytest

from nano_infer import LLMEngine, SamplingParams
from nano_infer.models.loader import TINY_MODEL_DIR


def test_each_step_publishes_a_new_frozen_record_and_a_published_one_never_changes():
    engine = LLMEngine(str(TINY_MODEL_DIR), dtype="float32", block_size=4, num_kv_blocks=64)
    first = engine.stats
    assert (first.model_name, first.max_model_len) == ("tiny", engine.max_model_len)
    assert (first.num_steps, first.num_running, first.num_kv_blocks, first.num_free_kv_blocks) == (0, 0, 64, 64)
    assert first.prefix_cache.query_tokens == 0 and first.host_tier is None
    engine.add_request("a", prompt_token_ids=list(range(1, 10)), params=SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()
    after_one = engine.stats
    assert after_one is not first and (after_one.num_steps, after_one.num_running, after_one.num_waiting) == (1, 1, 0)
    assert after_one.prefix_cache.query_tokens == 9 and after_one.num_free_kv_blocks < 64
    assert after_one.num_generated_tokens == 1 and after_one.num_forward_tokens == 9
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats.num_generated_tokens == 3 and engine.stats.num_running == 0
    assert after_one.num_generated_tokens == 1 and first.prefix_cache.query_tokens == 0  # copies, not views
    with pytest.raises(dataclasses.FrozenInstanceError):
        engine.stats.num_running = 5
