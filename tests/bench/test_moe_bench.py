"""`python -m nano_infer.bench.moe` on a tiny MoE checkpoint and one round: what it prints and returns is computed
from its rounds, its step split accounts for the step and leaves the engine as it was, and the packed experts it
times compute what the stacked ones do. No timing is asserted."""
import contextlib
import io
from statistics import median

import pytest
import torch

from nano_infer.bench import moe as bench_moe
from nano_infer.bench.__main__ import parse_args as bench_args
from nano_infer.models import moe
from nano_infer.models.packed import PackedExperts, can_pack
from tests.helpers.model_factory import make_moe_dir


@pytest.fixture(scope="module")
def printed_report(tmp_path_factory, tokenizer):
    """(what the bench printed, what it returned) on a tiny Qwen3-MoE (a dense layer among the sparse ones)."""
    folder = make_moe_dir("qwen3_moe", tmp_path_factory.mktemp("moe_bench"), tokenizer)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        out = bench_moe.run(str(folder), requests=3, rounds=1, dtype="float32", one_chat_len=(6, 4),
                            prompt_len=(4, 10), output_len=(2, 5))
    return printed.getvalue(), out


@pytest.fixture(scope="module")
def report(printed_report):
    return printed_report[1]


def test_the_ratios_are_the_medians_of_the_rounds(report):
    for case, per_token, tokens in (("one_chat", bench_moe.decode_seconds, "decode_tokens_per_s"),
                                    ("chats", bench_moe.batch_seconds, "tokens_per_s")):
        rows = report[case]["per_round"]
        theirs, ours = ([per_token(r) for r in rows[e]] for e in ("hf_continuous", "nano_infer"))
        assert len(ours) == len(theirs) == 1
        assert report[case]["ratio"] == pytest.approx(median(theirs) / median(ours))
        assert report[case][tokens] == pytest.approx({"nano_infer": 1 / median(ours), "hf_continuous": 1 / median(theirs)})
    assert [r["output_tokens"] for r in report["one_chat"]["per_round"]["nano_infer"]] == [4]


def test_the_printed_lines_carry_the_returned_numbers(printed_report):
    printed, out = printed_report
    assert f"= {out['one_chat']['ratio']:.2f}x (rounds" in printed and f"= {out['chats']['ratio']:.2f}x (rounds" in printed
    assert f"decode {out['one_chat']['decode_tokens_per_s']['nano_infer']:.1f} tok/s nano_infer" in printed
    assert f"{out['chats']['tokens_per_s']['nano_infer']:.1f} tok/s nano_infer" in printed
    assert f"{out['parameters']['active'] / 1e6:.1f}M active per token" in printed
    for piece in bench_moe.PIECES:
        assert f"{out['split'][1]['pieces'][piece] * 1e3:.2f}" in printed.split(piece)[1].splitlines()[0]


def test_active_parameters_leave_out_the_experts_a_token_skips(report):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(report["folder"])
    sparse = sum(moe.is_sparse_layer(cfg, i) for i in range(cfg.num_hidden_layers))
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    p = report["parameters"]
    assert p["experts"] == sparse * cfg.num_experts * expert
    assert p["total"] - p["active"] == sparse * (cfg.num_experts - cfg.num_experts_per_tok) * expert


def test_the_step_split_adds_up_and_leaves_the_engine_as_it_was(report):
    for split in report["split"]:
        pieces = split["pieces"]
        assert list(pieces) == bench_moe.PIECES and sum(pieces.values()) == pytest.approx(split["step_s"])
        assert all(pieces[p] > 0 for p in bench_moe.PIECES[1:3])  # grouping and the expert matmuls were seen
    assert [s["num_seqs"] for s in report["split"]] == [1, 3]
    assert moe.group_by_expert.__module__ == moe.__name__  # the wrapper is gone


def test_split_unhooks_the_model(tmp_path_factory, tokenizer):
    from nano_infer import LLMEngine

    engine = LLMEngine(str(make_moe_dir("olmoe", tmp_path_factory.mktemp("moe_split"), tokenizer)), dtype="float32")
    bench_moe.step_split(engine, 2, context=8, steps=2)
    blocks = [layer.mlp for layer in engine.model.layers if isinstance(layer.mlp, moe.SparseMoeBlock)]
    assert blocks and all("mlp" not in vars(b.experts) and not b._forward_hooks and not b.experts._forward_hooks
                          for b in blocks)
    assert "compute_logits" not in vars(engine.model) and not engine.has_unfinished_requests()


@pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16), reason="oneDNN without bfloat16 here")
@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_packed_experts_compute_what_the_stacked_ones_do(tokens):
    g = torch.Generator().manual_seed(tokens)
    stacked = moe.Experts(6, 2, 32, 16)  # experts 2..7 of a model's 10: pairs routed elsewhere are left out
    stacked.gate_up_proj.data = torch.randn(6, 32, 32, generator=g).bfloat16()
    stacked.down_proj.data = torch.randn(6, 32, 16, generator=g).bfloat16()
    packed = PackedExperts(stacked)
    x = torch.randn(tokens, 32, generator=g).bfloat16()
    weights, experts = moe.route(torch.randn(tokens, 10, generator=g), 3, True)
    assert torch.equal(packed(x, weights, experts), stacked(x, weights, experts))
    assert torch.equal(packed.gate_up_proj, stacked.gate_up_proj) and torch.equal(packed.down_proj, stacked.down_proj)


def test_the_main_bench_runs_the_moe_comparison_unless_told_not_to():
    args = bench_args([])
    assert not args.no_moe and args.moe_model == "olmoe-1b-7b-shape" and args.moe_model in bench_moe.MOE_SHAPES
    assert bench_args(["--no-moe"]).no_moe
