"""The one-chat comparison with llama.cpp, without llama.cpp: the message when it is missing, the
arguments, the ratio and roofline arithmetic, and the nano_infer side of a round."""
import importlib.util

import numpy as np
import pytest

from nano_infer.bench import llamacpp
from nano_infer.bench.__main__ import parse_args as bench_args


@pytest.fixture
def no_workers(monkeypatch):
    """A skipped comparison must start no worker process."""
    def refuse(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(llamacpp, "Worker", refuse)


def test_missing_llama_cpp_says_how_to_install_it_and_runs_nothing(monkeypatch, capsys, no_workers):
    real = importlib.util.find_spec
    monkeypatch.setattr(llamacpp.importlib.util, "find_spec", lambda name: None if name == "llama_cpp" else real(name))
    why = llamacpp.missing()
    assert "llama-cpp-python is not installed" in why and "make llama-cpp" in why
    assert llamacpp.run_or_explain(llamacpp.DEFAULT_GGUF) == {"skipped": why}
    assert capsys.readouterr().out.strip() == why


def test_a_missing_gguf_file_is_named_with_the_command_that_fetches_it(monkeypatch, tmp_path, capsys, no_workers):
    monkeypatch.setattr(llamacpp, "missing", lambda: None)  # as if llama-cpp-python were installed
    gone = tmp_path / "none.gguf"
    result = llamacpp.run_or_explain(gone)
    assert str(gone) in result["skipped"] and "make models" in result["skipped"]
    assert capsys.readouterr().out.strip() == result["skipped"]


def test_arguments_defaults_and_refusals(capsys):
    args = llamacpp.parse_args([])
    assert (args.model, args.rounds, args.threads, args.max_tokens, args.worker, args.quantization) == (
        str(llamacpp.DEFAULT_GGUF), 3, 2, 128, None, None)
    assert llamacpp.parse_args(["--quantization", "gguf"]).quantization == "gguf"
    for bad, said in ((["--rounds", "0"], "--rounds must be at least 1"), (["--threads", "0"], "--threads"),
                      (["--max-tokens", "1"], "--max-tokens must be at least 2"), (["--quantization", "int4"], "invalid choice")):
        with pytest.raises(SystemExit):
            llamacpp.parse_args(bad)
        assert said in capsys.readouterr().err
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        llamacpp.compare(rounds=0)


def test_the_main_bench_runs_the_comparison_unless_told_not_to():
    args = bench_args([])
    assert not args.no_llama_cpp and args.llama_cpp_model == str(llamacpp.DEFAULT_GGUF) and args.llama_cpp_rounds == 3
    assert bench_args(["--no-llama-cpp", "--llama-cpp-rounds", "5"]).no_llama_cpp


def test_paired_ratios_are_per_round_and_inconclusive_when_rounds_straddle_one():
    r = llamacpp.paired_ratios([10.0, 20.0, 30.0], [20.0, 10.0, 30.0])
    assert r["per_round"] == [0.5, 2.0, 1.0] and (r["median"], r["min"], r["max"]) == (1.0, 0.5, 2.0)
    assert r["verdict"] == "inconclusive"
    assert llamacpp.paired_ratios([9.0, 12.0], [10.0, 15.0])["verdict"] == "nano_infer faster"
    assert llamacpp.paired_ratios([11.0, 16.0], [10.0, 15.0])["verdict"] == "llama.cpp faster"
    with pytest.raises(ValueError, match="paired rounds"):
        llamacpp.paired_ratios([1.0, 2.0], [1.0])


def test_chat_timing_splits_first_token_from_the_rest():
    t = llamacpp.ChatTiming.from_times("e", 7, 1.0, [1.25, 1.30, 1.45], [4, 5, 6])
    assert t.ttft_ms == pytest.approx(250) and t.ms_per_token == pytest.approx(100) and t.prompt_tokens == 7
    with pytest.raises(ValueError, match="at least 2"):
        llamacpp.ChatTiming.from_times("e", 7, 1.0, [1.25], [4])
    assert llamacpp.leading_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert llamacpp.leading_agreement([1, 2], [1, 2, 3]) == 2


def test_roofline_is_the_weights_read_once_at_the_bandwidth(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "w.gguf"
    writer = GGUFWriter(str(path), "llama")
    a, b = np.ones((64, 32), dtype=np.float32), np.ones((16,), dtype=np.float16)
    writer.add_tensor("a", a)
    writer.add_tensor("b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    w = llamacpp.gguf_weight_bytes(path)
    assert w == {"tensors": 2, "stored_bytes": a.nbytes + b.nbytes, "elements": a.size + b.size,
                 "bfloat16_bytes": 2 * (a.size + b.size)}
    roof = llamacpp.roofline(w, bandwidth=1e6)
    assert roof["stored_ms"] == pytest.approx(1e3 * (a.nbytes + b.nbytes) / 1e6)
    assert roof["bfloat16_ms"] == pytest.approx(1e3 * 2 * (a.size + b.size) / 1e6)


def test_a_nano_infer_round_times_exactly_the_tokens_asked_for(qwen2_dir):
    """Each round's chat differs from the first line on (no prefix cache serves it); the run ignores EOS."""
    encode, run, before_load = llamacpp._nano_worker(str(qwen2_dir), threads=2, quantization="none")
    assert before_load > 0  # resident memory before the engine was built (building it may trim the heap below it)
    first, second = encode(llamacpp.chat(1)), encode(llamacpp.chat(2))
    assert llamacpp.leading_agreement(first, second) < 16  # inside the first block (16 tokens): no block shared
    t = run(first, 6)
    assert t.engine == "nano_infer" and t.prompt_tokens == len(first) and len(t.token_ids) == 6
    assert t.ttft_ms > 0 and t.ms_per_token > 0


def test_the_printed_summary_carries_the_ratios_verdicts_and_floors():
    runs = {"nano_infer": [{"ms_per_token": 20.0, "ttft_ms": 50.0}, {"ms_per_token": 30.0, "ttft_ms": 70.0}],
            "llama.cpp": [{"ms_per_token": 10.0, "ttft_ms": 100.0}, {"ms_per_token": 15.0, "ttft_ms": 60.0}]}
    weights = {"tensors": 3, "stored_bytes": 2**20, "elements": 2**20, "bfloat16_bytes": 2**21}
    result = {"model": "m.gguf", "max_tokens": 128, "threads": 2, "rounds": 2, "prompt_tokens": [80, 80],
              "peak_rss_mib": {"nano_infer": 500.0, "llama.cpp": 300.0},
              "grown_rss_mib": {"nano_infer": 250.4, "llama.cpp": None}, "same_leading_tokens": [5, 128],
              "median": {n: {k: sum(t[k] for t in rows) / 2 for k in ("ms_per_token", "ttft_ms")} for n, rows in runs.items()},
              "ratios": {k: llamacpp.paired_ratios([t[k] for t in runs["nano_infer"]], [t[k] for t in runs["llama.cpp"]])
                         for k in ("ms_per_token", "ttft_ms")},
              "weights": weights, "roofline": llamacpp.roofline(weights, 2**20 * 1e3), "llama_cpp_extra_buffer_types": False}
    text = llamacpp.format_result(result)
    assert "prompts of 80 tokens, 2 rounds; nano_infer with quantization=default" in text
    assert "decode ms/token: 2.00x (rounds 2.00-2.00) -> llama.cpp faster" in text
    assert "time to first token: 0.83x (rounds 0.50-1.17) -> inconclusive" in text
    assert "at least 1.0 ms/token as stored, 2.0 in bfloat16" in text
    assert "peak memory 500 MiB, grown 250 MiB by loading the file and the first chat" in text
    assert "peak memory 300 MiB\n" in text  # no resident-memory figure (not Linux): nothing said
    assert "nano_infer decodes at 25.0x the as-stored floor" in text and "without its extra buffer types" in text
