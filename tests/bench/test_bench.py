"""Plumbing of `python -m nano_infer.bench` on a tiny workload: right counts, right sums, a JSON report.

No timing is asserted: only that every engine generates exactly the requested tokens and
that the reported figures are computed from the per-round numbers the way they claim.
"""
import json
import statistics

import pytest
import torch

from nano_infer.bench.__main__ import main
from nano_infer.bench.compare import Bench, mean_decode_context
from nano_infer.bench.profile import KERNELS
from nano_infer.bench.random_model import random_model
from nano_infer.bench.roofline import flops_per_token, matmul_params, workload_flops
from nano_infer.bench.workload import (BenchRequest, Workload, make_workload, ordinary_token_ids, percentile,
                                       result_from_token_times)


def test_workload_same_lengths_fresh_tokens_each_round(tokenizer):
    ids = ordinary_token_ids(tokenizer)
    assert not set(ids) & set(tokenizer.all_special_ids) and len(ids) == len(tokenizer) - len(tokenizer.all_special_ids)
    a, b = make_workload(20, ids, seed=3, round=1), make_workload(20, ids, seed=3, round=2)
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in a.requests] == [(len(r.prompt_token_ids), r.max_tokens) for r in b.requests]
    assert [r.prompt_token_ids for r in a.requests] != [r.prompt_token_ids for r in b.requests]
    assert make_workload(20, ids, seed=3, round=1).requests == a.requests
    assert all(16 <= len(r.prompt_token_ids) <= 192 and 32 <= r.max_tokens <= 96 for r in a.requests)
    assert all(t in set(ids) for r in a.requests for t in r.prompt_token_ids)


def test_percentile_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [percentile(values, q) for q in (0, 20, 50, 99, 100)] == [1.0, 1.0, 3.0, 5.0, 5.0]
    assert percentile(list(range(1, 101)), 99) == 99


def test_result_from_token_times():
    wl = Workload("w", [BenchRequest([1, 2], 3), BenchRequest([3], 2)], 0)
    r = result_from_token_times("e", [[0.5, 0.7, 1.0], [0.2, 0.6]], wl, cpu_s=0.5)
    assert r.output_tokens == 5 and r.wall_s == 1.0 and r.ttft_s == [0.5, 0.2]
    assert r.itl_s == pytest.approx([0.2, 0.3, 0.4])
    assert r.summary()["tokens_per_s"] == 5.0 and r.summary()["tokens_per_cpu_s"] == 10.0
    with pytest.raises(RuntimeError, match="asked for 2 tokens and got 1"):
        result_from_token_times("e", [[0.5, 0.7, 1.0], [0.2]], wl, cpu_s=0.5)


def test_mean_decode_context():
    # 10-token prompt, 2 outputs: the first comes from the prefill's last position (10 keys), the second from
    # the decode of the first (11 keys); a 4-token prompt with 1 output: 4 keys
    wl = Workload("w", [BenchRequest([0] * 10, 2), BenchRequest([0] * 4, 1)], 0)
    assert mean_decode_context(wl) == pytest.approx((10 + 11 + 4) / 3)


def test_flops_count_matches_the_model_weights(qwen2_dir):
    from tests.helpers.model_factory import hf_model

    model = hf_model(qwen2_dir)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_params(model.config) == linear  # the tied LM head is one of the Linear modules
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert flops_per_token(cfg, 100) == 2 * linear + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * 100


def test_workload_flops_is_every_forwarded_token(qwen2_dir):
    """Counted token by token with flops_per_token: the prompt's tokens and all but the last output go through
    the layers, each over the keys up to itself; the LM head runs once per output."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(qwen2_dir)
    head = 2 * cfg.hidden_size * cfg.vocab_size
    expected = 0.0
    for p, m in [(5, 3), (1, 1), (12, 7)]:
        expected += sum(flops_per_token(cfg, i + 1) - head for i in range(p + m - 1)) + m * head
    assert workload_flops(cfg, [(5, 3), (1, 1), (12, 7)]) == pytest.approx(expected)
    assert workload_flops(cfg, [(5, 3)]) < workload_flops(cfg, [(6, 3)]) < workload_flops(cfg, [(6, 4)])


def test_random_model_has_the_shape_and_ties_the_head(tmp_path, qwen2_dir):
    from transformers import AutoModelForCausalLM

    dims = dict(model_type="llama", hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                intermediate_size=96, vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=True)
    folder = random_model(qwen2_dir, dims, "m", out_dir=tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == "llama" and model.config.hidden_size == 48 and model.config.num_key_value_heads == 2
    assert model.config.vocab_size == 1000 and torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert random_model(qwen2_dir, dims, "m", out_dir=tmp_path / "m") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        random_model(qwen2_dir, {**dims, "vocab_size": 10}, "m2", out_dir=tmp_path / "m2")


@pytest.fixture(scope="module")
def bench(qwen2_dir):
    b = Bench(qwen2_dir, static_batch_size=2, dtype="float32")
    yield b
    b.close()


def test_every_engine_generates_the_requested_tokens(bench):
    result = bench.run(3, rounds=2, prompt_len=(4, 12), output_len=(2, 6), log=lambda *_: None)
    wanted = result["output_tokens"]
    assert set(result["median"]) == {"nano_infer", "hf_static_b2", "hf_continuous"}
    for name, rows in result["per_round"].items():
        assert len(rows) == 2
        assert all(row["output_tokens"] == wanted for row in rows), name
        assert all(row["ttft_p50_ms"] <= row["ttft_p99_ms"] for row in rows)
    nano = result["per_round"]["nano_infer"]
    assert all(row["kv_used_mb"] <= row["kv_reserved_mb"] <= row["kv_pool_mb"] for row in nano)
    for name in ("hf_static_b2", "hf_continuous"):
        per_round = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(nano, result["per_round"][name])]
        assert result["ratios"][f"nano_infer / {name}"]["median"] == pytest.approx(statistics.median(per_round))
    assert result["median"]["nano_infer"]["tokens_per_s"] == pytest.approx(
        statistics.median(row["tokens_per_s"] for row in nano))


def test_nano_runs_leave_the_engine_clean(bench):
    bench.run(2, rounds=1, prompt_len=(4, 8), output_len=(2, 3), log=lambda *_: None)
    assert not bench.engine.has_unfinished_requests()
    assert not bench.engine.scheduler.running and not bench.engine.scheduler.waiting


def test_one_chat_latency_alternates_engines_and_reports_medians(bench):
    result = bench.latency(prompt_len=6, output_len=5, rounds=3, log=lambda *_: None)
    assert set(result["ms_per_token"]) == {"nano_infer", "hf_generate"}
    for name, rows in result["per_round"].items():
        assert len(rows) == 3 and all(row["output_tokens"] == 5 for row in rows)
        assert 0 < result["ms_per_token"][name] == pytest.approx(statistics.median(row["itl_mean_ms"] for row in rows))


@pytest.mark.slow
def test_command_line_writes_a_json_report(tmp_path, qwen2_dir, capsys):
    report = main(["--quick", "--model", str(qwen2_dir), "--requests", "2", "--engines", "nano_infer", "hf_continuous",
                   "--dtype", "float32", "bfloat16", "--out", str(tmp_path)])
    files = list(tmp_path.glob("bench-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == json.loads(json.dumps(report))
    assert [m["dtype"] for m in report["models"]] == ["float32", "bfloat16"]
    for entry in report["models"]:
        workload = entry["workloads"][0]
        assert workload["num_requests"] == 2 and set(workload["ratios"]) == {"nano_infer / hf_continuous"}
        ceiling = workload["ceiling_tokens_per_s"]
        assert ceiling == pytest.approx(workload["output_tokens"] * workload["matmul_gflops"] * 1e9 / workload["work_flops"])
        for name, share in workload["of_ceiling"].items():
            assert 0 < share == pytest.approx(workload["median"][name]["tokens_per_s"] / ceiling)
        floor = workload["kernel_floor"]  # a profiled run of the same shape: seconds per kind of kernel
        kernels = [floor["seconds"][kind] for kind in dict.fromkeys(KERNELS.values())]
        assert all(seconds > 0 for seconds in kernels) and sum(floor["seconds"].values()) >= sum(kernels)
        assert floor["tokens_per_s"] == pytest.approx(workload["output_tokens"] / sum(kernels))
        assert set(entry["latency"]["ms_per_token"]) == {"nano_infer", "hf_generate"}
    fp32, bf16 = (m["workloads"][0]["median"]["nano_infer"]["tokens_per_s"] for m in report["models"])
    [line] = report["summary"]
    assert line.startswith(f"{qwen2_dir}, 2 requests: float32: ") and f"bfloat16 / float32 = {bf16 / fp32:.2f}x" in line
    for entry in report["models"]:  # each dtype's ratio comes with the ratio its kernel floor allows
        w = entry["workloads"][0]
        floor_ratio = w["kernel_floor"]["tokens_per_s"] / w["median"]["hf_continuous"]["tokens_per_s"]
        assert w["kernel_floor"]["ratios"] == {"hf_continuous": pytest.approx(floor_ratio)}
        assert f"x transformers CB (kernel floor {floor_ratio:.1f}x)" in line
    out = capsys.readouterr().out
    assert "nano_infer / hf_continuous" in out and line in out
    assert out.count("kernel floor (a ") == 2 and "these kernels alone cap nano_infer's batches at" in out


def test_attention_case_memory_gather_grows_blockwise_stays_flat():
    from nano_infer.bench.attention import attention_scaling, step_case

    a = step_case("gather", [(40, 1), (0, 9), (300, 1)], 4, 2, 8, block_size=4)
    b = step_case("blockwise", [(40, 1), (0, 9), (300, 1)], 4, 2, 8, block_size=4, blocks_per_chunk=2)
    torch.testing.assert_close(a(), b(), atol=1e-5, rtol=1e-4)  # same pool, same q/k/v (same seed)
    rows = attention_scaling([64, 1024], batch=2, num_heads=4, num_kv_heads=2, head_dim=8, repeats=1, block_size=4,
                             blocks_per_chunk=2)
    mib = {(r["impl"], r["context"]): r["mib"] for r in rows}
    assert [r["ratio"] for r in rows if r["impl"] == "gather"] == [1.0, 1.0]  # each time is relative to gather's
    # gather copies K and V for every key: 2 x 2 seqs x 1024 keys x 2 heads x 8 dims x 4 bytes = 256 KiB at least
    assert mib["gather", 1024] * 2**20 >= 2 * 2 * 1024 * 2 * 8 * 4
    assert mib["blockwise", 1024] < mib["gather", 1024] / 4 and mib["blockwise", 1024] < 2 * mib["blockwise", 64]


def test_step_profile_accounts_for_the_step(qwen2_dir):
    from nano_infer import LLMEngine
    from nano_infer.bench.profile import fill, step_breakdown
    from nano_infer.engine.model_runner import ModelRunner

    engine = LLMEngine(str(qwen2_dir), dtype="float32")
    fill(engine, num_seqs=3, context=20)
    assert all(s.num_computed_tokens >= 20 for s in engine.scheduler.running) and not engine.scheduler.waiting
    per_step, pieces = step_breakdown(engine, steps=3)
    layer_parts = sum(v for k, v in pieces.items() if k in ("rmsnorm", "qkv_proj", "o_proj", "mlp gate_up", "mlp down"))
    assert 0 < layer_parts < pieces["model forward (all layers)"] < per_step
    assert pieces["attention (write KV + read through block table)"] < pieces["model forward (all layers)"]
    # hooks and wrappers are gone afterwards
    assert engine.runner.pack.__func__ is ModelRunner.pack and engine.runner.build.__func__ is ModelRunner.build
    assert not engine.model._forward_hooks
    assert all(not layer.mlp.gate_up_proj._forward_pre_hooks for layer in engine.model.layers)


def test_workload_breakdown_splits_the_run_by_kernel(qwen2_dir):
    from nano_infer import LLMEngine
    from nano_infer.bench.profile import workload_breakdown

    engine = LLMEngine(str(qwen2_dir), dtype="float32")
    workload = make_workload(4, ordinary_token_ids(engine.tokenizer), prompt_len=(8, 24), output_len=(3, 6))
    wall, kinds = workload_breakdown(engine, workload)
    assert set(KERNELS.values()) | {"other ops"} <= set(kinds)
    assert all(kinds[kind] > 0 for kind in KERNELS.values())  # every kind of kernel ran and was recognised
    ops = sum(v for k, v in kinds.items() if not k.startswith("outside ops"))
    assert ops <= 1.05 * wall and kinds["outside ops (Python, engine bookkeeping)"] == pytest.approx(max(0, wall - ops))
    assert not engine.has_unfinished_requests()


def test_profile_command_line_prints_the_workload_floor(qwen2_dir, capsys):
    from nano_infer.bench.profile import main as profile_main

    profile_main(["--model", str(qwen2_dir), "--dtype", "float32", "--workload", "3", "--prompt-len", "8", "16",
                  "--output-len", "2", "4"])
    out = capsys.readouterr().out
    assert out.startswith("3 requests (prompts 8-16, outputs 2-4 tokens), float32")
    assert "  matmul " in out and "at most" in out and "tok/s with these kernels" in out


def test_decode_reads_every_matmul_weight_and_the_cached_kv(qwen2_dir):
    from nano_infer import LLMEngine
    from nano_infer.bench.decode import bytes_per_step

    engine = LLMEngine(str(qwen2_dir), dtype="bfloat16")
    cfg = engine.hf_config
    assert cfg.tie_word_embeddings  # the embedding is the LM head: the one 2-D weight outside the layers is read too
    matrices = sum(p.numel() for p in engine.model.parameters() if p.dim() == 2)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    weights, kv = bytes_per_step(engine, num_seqs=3, context=10)
    assert weights == 2 * matrices
    assert kv == 3 * 10 * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2  # K and V, 2 bytes each


def test_decode_counts_weights_as_held_when_quantized():
    """int4 layers read half a byte a weight plus a bfloat16 scale and zero per 32, int8 a byte plus a scale per
    row; the tied LM head stays bfloat16 (2 bytes a weight) either way."""
    from nano_infer import LLMEngine
    from nano_infer.bench.decode import bytes_per_step
    from nano_infer.models.loader import TINY_MODEL_DIR

    plain = LLMEngine(str(TINY_MODEL_DIR), dtype="bfloat16", num_kv_blocks=16)
    shapes = [tuple(p.shape) for name, p in plain.model.layers.named_parameters() if p.dim() == 2]
    head = plain.model.embed_tokens.weight.numel() * 2
    assert bytes_per_step(plain, 1, 1)[0] == head + sum(2 * n * k for n, k in shapes)
    expected = {"int4": head + sum(n * k // 2 + (k // 32) * n * 2 * 2 for n, k in shapes),
                "int8": head + sum(n * k + n * 2 for n, k in shapes)}
    for mode, weights in expected.items():
        engine = LLMEngine(str(TINY_MODEL_DIR), dtype="bfloat16", quantization=mode, num_kv_blocks=16)
        assert bytes_per_step(engine, 1, 1)[0] == weights, mode


def test_decode_command_line_times_each_batch_and_profiles(qwen2_dir, tmp_path, capsys):
    from transformers import AutoConfig

    from nano_infer.bench.decode import main as decode_main

    report = decode_main(["--model", str(qwen2_dir), "--dtype", "float32", "--seqs", "1", "4", "--context", "16",
                          "--steps", "2", "--profile", "2", "--json", str(tmp_path / "d.json")])
    assert [r["num_seqs"] for r in report["rows"]] == [1, 4]
    for r in report["rows"]:
        assert r["step_ms"] > 0 and r["read_bytes_per_s"] == pytest.approx((r["weight_bytes"] + r["kv_bytes"]) / r["step_ms"] * 1e3)
        assert r["of_bandwidth"] == pytest.approx(r["read_bytes_per_s"] / report["bandwidth_bytes_per_s"])
    assert report["rows"][1]["kv_bytes"] == 4 * report["rows"][0]["kv_bytes"]
    assert 1e8 < report["bandwidth_bytes_per_s"] < 1e13
    assert "aten::" in report["profile"] and "Self CPU" in report["profile"]
    assert json.loads((tmp_path / "d.json").read_text())["rows"] == report["rows"]
    cfg = AutoConfig.from_pretrained(qwen2_dir)
    assert report["memory"]["kv_pool"] % (cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * 4) == 0  # whole float32 slots
    assert report["params"] == matmul_params(cfg)
    assert report["memory"]["weights"] >= 4 * report["params"]  # float32: 4 bytes a matmul weight, and the rest
    out = capsys.readouterr().out
    assert "memory: weights " in out and "copy bandwidth measured now" in out and "   4 sequences at ~" in out


def test_compile_sizes_reach_the_engine_and_leave_out_the_kernel_floor(tmp_path, qwen2_dir, capsys):
    """`--compile-sizes`: nano_infer's CPU decode step compiled for those batch sizes before the first round; no
    kernel floor, which counts the eager step's ops by name."""
    report = main(["--quick", "--model", str(qwen2_dir), "--requests", "2", "--engines", "nano_infer", "--dtype",
                   "float32", "--compile-sizes", "2", "--no-latency", "--out", str(tmp_path)])
    [entry] = report["models"]
    assert entry["nano_options"]["compilation_config"] == {"compile_sizes": [2]}
    assert "kernel_floor" not in entry["workloads"][0]
    out = capsys.readouterr().out
    assert "kernel floor: not measured with --compile-sizes" in out and "these kernels alone cap" not in out
