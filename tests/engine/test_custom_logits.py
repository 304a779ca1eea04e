"""vLLM's custom logits processors (v1 interface): the persistent batch's rows against a model of it kept here,
and a processor written as vLLM's documentation describes one, through LLM.generate."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer import LLM, SamplingParams
from nano_infer.engine.custom_logits import PersistentBatch
from nano_infer.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from nano_infer.v1.sample.logits_processor.builtin import process_dict_updates


class ForceToken(LogitsProcessor):
    """Rows whose request names `extra_args["target_token"]` can only produce that token."""

    def __init__(self, vllm_config, device, is_pin_memory):
        self.targets: dict[int, int] = {}
        self.updates: list[BatchUpdate | None] = []

    @classmethod
    def validate_params(cls, params):
        target = (params.extra_args or {}).get("target_token")
        if target is not None and not isinstance(target, int):
            raise ValueError(f"target_token must be a token id, got {target!r}")

    def is_argmax_invariant(self):
        return False

    def update_state(self, batch_update):
        self.updates.append(batch_update)
        process_dict_updates(self.targets, batch_update,
                             lambda params, _prompt, _output: (params.extra_args or {}).get("target_token"))

    def apply(self, logits):
        for row, target in self.targets.items():
            keep = logits[row, target].item()
            logits[row] = float("-inf")
            logits[row, target] = keep
        return logits


class Seq:
    def __init__(self, seq_id):
        self.seq_id, self.params, self.prompt_token_ids = seq_id, SamplingParams(), [1, 2]
        self.token_ids, self.num_prompt_tokens = [1, 2], 2


class RowOwners(LogitsProcessor):
    """Keeps {row: seq id} through process_dict_updates, as a processor keeps its per-request state."""

    def __init__(self, *args):
        self.owner: dict[int, int] = {}
        self.batch_size = 0

    def is_argmax_invariant(self):
        return True

    def update_state(self, batch_update):
        if batch_update is not None:
            self.batch_size = batch_update.batch_size
            assert all(how is MoveDirectionality.UNIDIRECTIONAL for *_, how in batch_update.moved)
        process_dict_updates(self.owner, batch_update, lambda params, prompt, output: params.extra_args["id"])

    def apply(self, logits):
        return logits


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.sets(st.integers(0, 11), max_size=8), min_size=1, max_size=12))
def test_each_row_belongs_to_the_sequence_the_batch_says_and_rows_stay_dense(steps):
    """Any order of sequences joining and leaving: the processor's dict, fed only the updates, names for every
    row the sequence whose logits the step put there, and the rows are 0 .. batch_size - 1."""
    owners = RowOwners()
    batch, seqs = PersistentBatch([owners]), {}
    for members in steps:
        step = []
        for i in sorted(members, key=lambda i: (i * 7) % 5):  # a scheduled order that is not the ids' order
            seq = seqs.setdefault(i, Seq(i))
            seq.params = SamplingParams(extra_args={"id": i})
            step.append(seq)
        logits = torch.arange(len(step), dtype=torch.float32).unsqueeze(1).repeat(1, 3)  # row r holds r
        out = batch(logits, step)
        assert torch.equal(out, logits)  # back in scheduled order
        assert owners.batch_size == len(step) and sorted(owners.owner) == list(range(len(step)))
        assert {owners.owner[r] for r in range(len(step))} == members
        assert {owners.owner[batch.rows.index(s.seq_id)] for s in step} == members


def test_a_processor_as_vllms_docs_write_one_forces_its_requests_tokens(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, logits_processors=[ForceToken])
    plain = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    lengths = [3, 9, 5, 12]  # requests end at different steps: rows are removed and moved while others run
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                             extra_args={"target_token": 42} if i % 2 else None) for i, n in enumerate(lengths)]
    prompts = ["To be, or not to be", "The quick brown fox", "def f(x):", "你好"]
    outs = llm.generate(prompts, params)
    ref = plain.generate(prompts, params)
    for i, (o, r) in enumerate(zip(outs, ref)):
        assert len(o.outputs[0].token_ids) == lengths[i]
        if i % 2:
            assert set(o.outputs[0].token_ids) == {42}
        else:
            assert o.outputs[0].token_ids == r.outputs[0].token_ids
    processor = llm.engine.output_processor.custom.processors[0]
    assert any(u is not None and u.moved for u in processor.updates)
    with pytest.raises(ValueError, match="target_token must be a token id"):
        llm.generate(["x"], SamplingParams(max_tokens=2, extra_args={"target_token": "a"}))


def test_what_cannot_be_a_processor_is_refused(qwen2_dir):
    with pytest.raises(ValueError, match="not a subclass of LogitsProcessor"):
        LLM(str(qwen2_dir), dtype="float32", logits_processors=[object])
    with pytest.raises(ValueError, match="names no class"):
        LLM(str(qwen2_dir), dtype="float32", logits_processors=["no_such_module.Processor"])
    with pytest.raises(ValueError, match="speculative_config with logits_processors"):
        LLM(str(qwen2_dir), dtype="float32", logits_processors=[ForceToken],
            speculative_config={"method": "ngram", "num_speculative_tokens": 2})


def test_a_requests_output_ids_are_a_view_that_grows_with_it():
    from nano_infer.engine.custom_logits import OutputIds

    seq = Seq(0)
    out = OutputIds(seq)
    assert list(out) == [] and len(out) == 0
    seq.token_ids += [7, 8, 9]
    assert list(out) == [7, 8, 9] and out[-1] == 9 and out[1:] == [8, 9]
    with pytest.raises(IndexError):
        out[3]
