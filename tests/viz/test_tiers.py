"""Chapter 12's recording of the two KV tiers and its stepper: every copy the tier counted is drawn, once,
between cells in the states the copy leaves them in."""
import shutil

import pytest

from nano_infer import LLM, SamplingParams, default_model
from nano_infer.bench import offload as ob
from nano_infer.viz.tiers import (CACHED, FREE, HOST_CACHED, RUNNING, SWAPPED, TierRecorder, eventful,
                                  tier_figure, tier_stepper)

BS, DEVICE_BLOCKS, HOST_BLOCKS = 16, 8, 32
BLOCK_BYTES = 2560 * BS  # the shipped model in float32


@pytest.fixture(scope="module")
def recorded():
    llm = LLM(default_model(), dtype="float32", block_size=BS, num_kv_blocks=DEVICE_BLOCKS,
              kv_offloading_size=HOST_BLOCKS * BLOCK_BYTES / 2**30, preemption_mode="swap")
    chats = ob.multi_turn_chats(llm.tokenizer, num_chats=3, num_turns=2, system_tokens=16)
    prompts = [ob.prefixed_prompt(llm.tokenizer, 40, 0, seed=s) for s in range(3)]
    with TierRecorder(llm.engine) as rec:
        ob.run_chats({"tier": llm}, chats, max_tokens=8)  # histories evicted to the host, then loaded back
        llm.generate(prompt_token_ids=prompts, use_tqdm=False,  # more than the pool holds: swaps
                     sampling_params=SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    return llm, rec.snapshots


def test_the_run_offloads_loads_and_swaps_both_ways(recorded):
    _, snaps = recorded
    for kind in ("offloads", "loads", "swap_outs", "swap_ins"):
        assert any(getattr(s, kind) for s in snaps), f"no step with {kind}"


def test_the_copies_drawn_add_up_to_the_tier_counters(recorded):
    llm, snaps = recorded
    stats = llm.engine.kv.tier.stats
    total = {"offloads": 0, "loads": 0, "swap_outs": 0, "swap_ins": 0}
    for s in snaps:  # after each step, the tier's counters equal the copies recorded so far
        for kind in total:
            total[kind] += len(getattr(s, kind))
        assert s.stats.offloaded_blocks == total["offloads"] and s.stats.loaded_blocks == total["loads"]
        assert s.stats.swapped_out_blocks == total["swap_outs"] and s.stats.swapped_in_blocks == total["swap_ins"]
    assert (total["offloads"], total["loads"]) == (stats.offloaded_blocks, stats.loaded_blocks)
    assert (total["swap_outs"], total["swap_ins"]) == (stats.swapped_out_blocks, stats.swapped_in_blocks)
    assert stats.swap_preemptions > 0


def test_each_copy_leaves_its_cells_in_the_state_it_should(recorded):
    _, snaps = recorded
    for prev, s in zip(snaps, snaps[1:]):
        assert [s.step for s in (prev, s)] == [prev.step, prev.step + 1]
        for device, host in s.offloads:
            assert s.host[host] == HOST_CACHED
        for host, device in s.loads:
            assert prev.host[host] == HOST_CACHED and s.device[device] in (RUNNING, CACHED)
        for device, host in s.swap_outs:
            assert s.host[host] == SWAPPED and host in s.host_owner
        for host, device in s.swap_ins:
            assert prev.host[host] == SWAPPED and s.device[device] == RUNNING


def test_the_last_snapshot_matches_the_engine(recorded):
    llm, snaps = recorded
    kv, last = llm.engine.kv, snaps[-1]
    assert len(last.device) == DEVICE_BLOCKS and len(last.host) == HOST_BLOCKS
    assert last.device.count(FREE) == kv.num_free_blocks
    assert last.device.count(CACHED) == llm.engine.prefix_cache.num_cached_blocks()
    assert last.host.count(HOST_CACHED) == kv.tier.num_cached_blocks() and last.host.count(SWAPPED) == 0
    assert last.host.count(FREE) == kv.tier.num_free_blocks


def test_the_recorder_puts_the_engine_back_and_needs_a_tier(recorded):
    llm, _ = recorded
    assert "step" not in vars(llm.engine) and "adjust" not in vars(llm.engine.offloader)
    with pytest.raises(ValueError, match="kv_offloading_size"):
        TierRecorder(LLM(default_model(), dtype="float32", num_kv_blocks=8).engine)


def test_eventful_keeps_the_steps_that_move_or_prefill(recorded):
    _, snaps = recorded
    kept = eventful(snaps)
    assert kept[-1] is snaps[-1] and len(kept) < len(snaps)
    moved = [s for s in snaps if s.num_moved or s.preempted or any(k == "prefill" for *_, k in s.scheduled)]
    assert all(s in kept for s in moved)


def test_the_stepper_has_a_frame_per_snapshot_with_the_recorded_states(recorded):
    _, snaps = recorded
    shown = eventful(snaps)
    fig = tier_stepper(shown, columns=8)
    assert len(fig.frames) == len(shown) and len(fig.layout.sliders[0].steps) == len(shown)
    assert [t.type for t in fig.data] == [t.type for t in fig.frames[0].data]  # the static image: state 0
    assert fig.data[0].z == fig.frames[0].data[0].z
    for i, s in enumerate(shown):
        device, host = fig.frames[i].data[0], fig.frames[i].data[1]
        assert [v for row in device.z for v in row if v is not None] == s.device
        assert [v for row in host.z for v in row if v is not None] == s.host
        arrows = [a for a in fig.frames[i].layout.annotations if a.showarrow]
        assert len(arrows) == min(s.num_moved, 32)
        assert fig.frames[i].layout.title.text == tier_figure(shown, i, columns=8).layout.title.text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="a static image needs kaleido and a chromium")
def test_the_stepper_draws_a_static_image(recorded):
    _, snaps = recorded
    png = tier_stepper(eventful(snaps)).to_image(format="png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
