"""The llama.cpp comparison's other model sizes and busy machine, without llama.cpp: the shaped GGUF file (read
by nano_infer: its hyperparameters, tensor types and SmolLM2's tokenizer), the busy processes (paused outside a busy
run), the slowdown arithmetic and its summary lines, the new flags."""
import time
from pathlib import Path

import pytest

from nano_infer.bench import llamacpp
from nano_infer.bench.busy import BusyLoad
from nano_infer.bench.random_model import QWEN2_5_0_5B
from nano_infer.bench.shaped_gguf import shaped_gguf_path, write_shaped_gguf

TINY = dict(QWEN2_5_0_5B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=49152 + 40)  # SmolLM2's 49,152 tokens and 40 padding rows


@pytest.mark.slow
def test_a_shaped_file_has_the_shape_the_types_and_smollm2s_tokenizer(tmp_path):
    from nano_infer import LLM, SamplingParams
    from nano_infer.models.gguf import read_gguf_tensors
    from nano_infer.models.loader import load_tokenizer

    path = write_shaped_gguf(TINY, tmp_path / "tiny.gguf", llamacpp.DEFAULT_GGUF)
    types = {t.name: t.tensor_type.name for t in read_gguf_tensors(path)}
    assert types["token_embd.weight"] == "Q8_0" and types["blk.1.ffn_down.weight"] == "Q4_1"
    assert types["blk.0.attn_q.bias"] == "F32" and "output.weight" not in types  # tied, as Qwen2.5-0.5B's
    assert len(types) == 1 + 2 * 12 + 1 and not list(tmp_path.glob("*.partial"))
    llm = LLM(str(path), dtype="float32")
    source = load_tokenizer(llamacpp.DEFAULT_GGUF.parent, llamacpp.DEFAULT_GGUF.name)
    config = llm.engine.model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads, config.intermediate_size,
            config.vocab_size) == (64, 2, 2, 128, 49192)
    text = "Hello there: <|im_start|>user, ünïcode and numbers 12345"
    assert llm.tokenizer.encode(text) == source.encode(text) and len(llm.tokenizer) == 49192
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_shapes_are_named_and_kept_beside_the_tokenizers_file(tmp_path):
    assert shaped_gguf_path("1.5b", tmp_path / "smol.gguf") == tmp_path / "qwen2.5-1.5b-shape.Q4_1.gguf"
    with pytest.raises(ValueError, match="use one of 0.5b, 1.5b"):
        shaped_gguf_path("7b", llamacpp.DEFAULT_GGUF)
    with pytest.raises(ValueError, match="smaller than the tokenizer's 49152 tokens"):
        write_shaped_gguf(dict(TINY, vocab_size=1000), tmp_path / "x.gguf", llamacpp.DEFAULT_GGUF)


def _state(pid: int) -> str:
    """A process's scheduler state from /proc: R running, S sleeping, T stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_busy_processes_run_only_inside_a_busy_run():
    load = BusyLoad(1, "spin")
    (proc,) = load.procs
    try:
        assert _state(proc.pid) == "T"
        idle = _cpu_ticks(proc.pid)
        time.sleep(0.3)
        assert _cpu_ticks(proc.pid) == idle  # paused: no CPU time while quiet runs are timed
        with load:
            assert _state(proc.pid) in "RS"
            time.sleep(0.3)
        assert _state(proc.pid) == "T" and _cpu_ticks(proc.pid) > idle
        assert load.describe() == "1 spinning Python loop"
    finally:
        load.close()
    assert proc.poll() is not None


def test_busy_refusals():
    for args, said in (((1, "video"), "busy kind 'video' is unknown"), ((-1,), "at least 0"),
                       ((1, "decode"), "needs the model file")):
        with pytest.raises(ValueError, match=said):
            BusyLoad(*args)


def test_slowdowns_are_per_engine_and_round_and_their_ratio_has_a_verdict():
    quiet = {"nano_infer": [{"ms_per_token": 20.0}, {"ms_per_token": 10.0}],
             "llama.cpp": [{"ms_per_token": 10.0}, {"ms_per_token": 10.0}]}
    busy = {"nano_infer": [{"ms_per_token": 30.0}, {"ms_per_token": 12.0}],
            "llama.cpp": [{"ms_per_token": 12.0}, {"ms_per_token": 11.0}]}
    result = llamacpp.busy_result(quiet, busy, "2 spinning Python loops")
    assert result["slowdown"]["nano_infer"]["per_round"] == [1.5, 1.2]
    assert result["slowdown"]["llama.cpp"]["per_round"] == pytest.approx([1.2, 1.1])
    assert result["slowdown_ratio"]["per_round"] == pytest.approx([1.25, 1.2 / 1.1])
    assert result["slowdown_ratio"]["verdict"] == "llama.cpp faster"
    assert result["median_ms_per_token"] == {"nano_infer": 21.0, "llama.cpp": 11.5}
    runs = {n: [dict(t, ttft_ms=50.0) for t in rows] for n, rows in quiet.items()}
    weights = {"tensors": 3, "stored_bytes": 2**20, "elements": 2**20, "bfloat16_bytes": 2**21}
    text = llamacpp.format_result({
        "model": "m.gguf", "max_tokens": 128, "threads": 2, "rounds": 2, "prompt_tokens": [80, 80],
        "peak_rss_mib": {"nano_infer": 500.0, "llama.cpp": 300.0}, "same_leading_tokens": [5, 128],
        "median": {n: {"ms_per_token": 15.0, "ttft_ms": 50.0} for n in runs}, "weights": weights,
        "ratios": {k: llamacpp.paired_ratios([t[k] for t in runs["nano_infer"]], [t[k] for t in runs["llama.cpp"]])
                   for k in ("ms_per_token", "ttft_ms")},
        "roofline": llamacpp.roofline(weights, 2**20 * 1e3), "busy": result})
    assert "beside 2 spinning Python loops:" in text
    assert "nano_infer:   21.0 ms/token, 1.35x its quiet time (rounds 1.20-1.50)" in text
    assert "nano_infer's slowdown / llama.cpp's: 1.17x (rounds 1.09-1.25) -> llama.cpp slows less" in text


def test_shape_and_busy_flags(capsys):
    args = llamacpp.parse_args(["--shape", "0.5b", "--busy", "2", "--busy-kind", "decode"])
    assert (args.shape, args.busy, args.busy_kind) == ("0.5b", 2, "decode")
    assert (llamacpp.parse_args([]).shape, llamacpp.parse_args([]).busy) == ("smollm2", 0)
    for bad, said in ((["--busy", "-1"], "--busy must be at least 0"), (["--shape", "7b"], "invalid choice"),
                      (["--busy-kind", "video"], "invalid choice")):
        with pytest.raises(SystemExit):
            llamacpp.parse_args(bad)
        assert said in capsys.readouterr().err
