"""Find a model (hub id, local folder, or the shipped tiny model) and load it without a second copy.

The module is built on the meta device (no memory), then each tensor is read from the
safetensors files straight onto the target device and assigned. q/k/v and gate/up are
concatenated on the way in to match the fused projections in `llama.py`.

With tensor parallelism each rank reads only its slice of each tensor (`TPShard.partition`),
before the fusing: q, k and v (gate and up) are cut separately, so a fused weight holds this
rank's query heads, then its KV heads, then their values, just as the forward expects.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

TINY_MODEL_DIR = Path(__file__).parent / "tiny"
DEFAULT_CUDA_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
SUPPORTED = {"llama", "qwen2", "qwen3"}


def default_model() -> str:
    """NANO_INFER_MODEL if set; a Qwen2.5 instruct model on CUDA; else the model shipped in the package."""
    if os.environ.get("NANO_INFER_MODEL"):
        return os.environ["NANO_INFER_MODEL"]
    if torch.cuda.is_available():
        return DEFAULT_CUDA_MODEL
    return str(TINY_MODEL_DIR)


def resolve_model_dir(model: str | os.PathLike) -> Path:
    """A local folder as is; otherwise a hub id, downloaded (or found in the local HF cache)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model folder {path} has no config.json: not a Hugging Face checkpoint")
        return path
    model = str(model)
    if model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise ValueError(
            f"model {model!r} is neither a local folder nor a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as e:  # offline, unknown repo, gated repo: all end here
        raise ValueError(
            f"could not fetch model {model!r} from the Hugging Face hub ({type(e).__name__}: {e}). "
            f"Without network, use a local folder or the shipped model: LLM() or LLM({str(TINY_MODEL_DIR)!r})"
        ) from e


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    names = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype={dtype!r} is invalid: use one of {sorted(names)} or 'auto'")
    return names[dtype]


def load_config(model_dir: Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in SUPPORTED:
        raise ValueError(f"model_type {config.model_type!r} is not supported; nano_infer runs {sorted(SUPPORTED)}")
    return config


def _fused_name(name: str) -> tuple[str, int | None]:
    """HF tensor name -> (our name, index of the shard it fills in a fused weight or None)."""
    name = name.removeprefix("model.")
    for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
        if f".{part}." in name:
            return name.replace(part, "qkv_proj"), i
    for i, part in enumerate(("gate_proj", "up_proj")):
        if f".{part}." in name:
            return name.replace(part, "gate_up_proj"), i
    return name, None


def _read(f, hf_name: str, name: str, config, model, tp) -> torch.Tensor:
    """The whole tensor, or this rank's slice of it, read straight from the file."""
    if tp is None:
        return f.get_tensor(hf_name)
    part = tp.partition(name, config, model.head_dim)
    if part is None:
        tensor = f.get_tensor(hf_name)
        if tp.rank and name.endswith("down_proj.bias"):  # row-parallel bias: added once, after the all-reduce sums
            tensor.zero_()
        return tensor
    dim, start, stop = part
    view = f.get_slice(hf_name)
    if dim == 1:
        return view[:, start:stop]
    tensor = view[start:stop]
    if name in ("embed_tokens.weight", "lm_head.weight"):  # the last vocabulary slice: zero rows up to vocab_rows
        pad = tp.vocab_rows(config) - tensor.shape[0]
        tensor = torch.cat([tensor, tensor.new_zeros(pad, *tensor.shape[1:])]) if pad else tensor
    return tensor


def load_model(model_dir: Path, config, device: torch.device, dtype: torch.dtype, max_positions: int, tp=None):
    """The model on `device` in `dtype`; with `tp` (a TPShard) only that rank's slices of the weights."""
    from accelerate import init_empty_weights
    from safetensors import safe_open

    from .llama import CausalLM

    with init_empty_weights(include_buffers=False):
        model = CausalLM(config, max_positions=max_positions, tp=tp)
    model.rotary.to(device)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {model_dir}")
    shards: dict[str, list] = {}
    state = {}
    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for hf_name in f.keys():
                name, index = _fused_name(hf_name)
                if name == "lm_head.weight" and model.tie_word_embeddings:
                    continue
                tensor = _read(f, hf_name, hf_name.removeprefix("model."), config, model, tp).to(dtype)
                if index is None:
                    state[name] = tensor
                else:
                    shards.setdefault(name, [None] * (3 if "qkv" in name else 2))[index] = tensor
    for name, parts in shards.items():
        if any(p is None for p in parts):
            raise ValueError(f"checkpoint in {model_dir} is missing part of {name}")
        state[name] = torch.cat(parts, dim=0)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"checkpoint/model mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval()
