"""Model choice and loading: the default model, the offline guard, dtype choice."""
import socket

import pytest
import torch

from nano_infer.models.loader import TINY_MODEL_DIR, cpu_has_native_bf16, default_model, pick_dtype


def test_default_model_follows_env_then_device(monkeypatch):
    monkeypatch.setenv("NANO_INFER_MODEL", "/some/folder")
    assert default_model() == "/some/folder"
    monkeypatch.delenv("NANO_INFER_MODEL")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_model() == str(TINY_MODEL_DIR)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_model() == "Qwen/Qwen2.5-1.5B-Instruct"


def test_dtype_defaults_and_errors(monkeypatch):
    assert pick_dtype(torch.device("cpu"), "bfloat16") == (torch.bfloat16, "asked for")
    assert pick_dtype(torch.device("cpu"), torch.float16)[0] is torch.float16
    with pytest.raises(ValueError, match="dtype='fp8'"):
        pick_dtype(torch.device("cpu"), "fp8")
    for flags, expected in [({"avx512_bf16": True}, torch.bfloat16), ({"amx_bf16": True, "avx512_bf16": False}, torch.bfloat16),
                            ({"avx512_f": True, "avx512_bf16": False}, torch.float32), ({}, torch.float32)]:
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda flags=flags: flags)
        dtype, why = pick_dtype(torch.device("cpu"), "auto")
        assert dtype is expected and why.startswith("auto") and ("no native" in why) == (expected is torch.float32)


def test_startup_line_names_dtype_reason_and_kv_capacity(qwen2_dir):
    from nano_infer import LLMEngine

    engine = LLMEngine(str(qwen2_dir), num_kv_blocks=10, block_size=4)
    expected = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    assert engine.dtype is expected and engine.kv_pool.tensor.dtype is expected  # the KV pool follows the model
    assert f"{str(expected).removeprefix('torch.')} (auto: the CPU has" in engine.startup_line
    assert "paged KV cache" in engine.startup_line and "= 40 tokens" in engine.startup_line
    engine = LLMEngine(str(qwen2_dir), dtype="float32", kv_cache="none")
    assert "float32 (asked for)" in engine.startup_line and "no KV cache" in engine.startup_line


def test_network_is_refused_by_the_guard_not_left_to_time_out():
    with pytest.raises(OSError, match="tests may not reach the network"):
        socket.create_connection(("93.184.216.34", 80), timeout=30)


def test_missing_config_is_a_clear_error(tmp_path):
    from nano_infer import LLM

    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no config.json"):
        LLM(str(tmp_path))
