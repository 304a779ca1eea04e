"""Model choice and loading: the default model, the offline guard, dtype choice."""
import socket

import pytest
import torch

from nano_infer.models.loader import TINY_MODEL_DIR, default_model, pick_dtype


def test_default_model_follows_env_then_device(monkeypatch):
    monkeypatch.setenv("NANO_INFER_MODEL", "/some/folder")
    assert default_model() == "/some/folder"
    monkeypatch.delenv("NANO_INFER_MODEL")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_model() == str(TINY_MODEL_DIR)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_model() == "Qwen/Qwen2.5-1.5B-Instruct"


def test_dtype_defaults_and_errors():
    assert pick_dtype(torch.device("cpu"), "auto") is torch.float32
    assert pick_dtype(torch.device("cpu"), "bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype='fp8'"):
        pick_dtype(torch.device("cpu"), "fp8")


def test_network_is_refused_by_the_guard_not_left_to_time_out():
    with pytest.raises(OSError, match="tests may not reach the network"):
        socket.create_connection(("93.184.216.34", 80), timeout=30)


def test_missing_config_is_a_clear_error(tmp_path):
    from nano_infer import LLM

    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="no config.json"):
        LLM(str(tmp_path))
