"""Find a model (hub id, local folder, GGUF file, or the shipped tiny model) and load it without a second copy.

The module is built on the meta device (no memory), then each tensor is read from the
safetensors files straight onto the target device and assigned. q/k/v and gate/up are
concatenated on the way in to match the fused projections in `llama.py`.

With tensor parallelism each rank reads only its slice of each tensor (`TPShard.partition`),
before the fusing: q, k and v (gate and up) are cut separately, so a fused weight holds this
rank's query heads, then its KV heads, then their values, just as the forward expects.

A llama.cpp / Ollama GGUF file gives config, tokenizer and chat template from its metadata;
its quantized tensors run as stored (`quantization.py`; the default on a CPU in bfloat16), or are
dequantized to the engine's dtype as they are read (`gguf.py`). transformers reads the config and
the tokenizer by parsing the whole file's metadata, slow for a vocabulary of tens of thousands
of tokens, so a process keeps both pickled and a second engine on the file gets its own copies
(pickled, since as an object the tokenizer holds many times its bytes for as long as the process runs).

A safetensors checkpoint can be quantized at load (quantization="int8" / "int4"): each weight
as soon as it is whole, so no full-precision copy of the model is ever held.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch

from ..config import num_experts
from .checkpoint_names import canonical, fused_name, whole
from .gguf_reads import read_from_gguf
from .quantization import (describe_weights, install_quantized, quantize_weight, quantized_linear,
                           resolve_quantization)

TINY_MODEL_DIR = Path(__file__).parent / "tiny"
DEFAULT_CUDA_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
SUPPORTED = {"llama", "qwen2", "qwen3", "qwen3_moe", "olmoe", "mixtral"}



def default_model() -> str:
    """NANO_INFER_MODEL if set; a Qwen2.5 instruct model on CUDA; else the model shipped in the package."""
    if os.environ.get("NANO_INFER_MODEL"):
        return os.environ["NANO_INFER_MODEL"]
    if torch.cuda.is_available():
        return DEFAULT_CUDA_MODEL
    return str(TINY_MODEL_DIR)


def resolve_model(model: str | os.PathLike, gguf_file: str | None = None) -> tuple[Path, str | None]:
    """(checkpoint folder, GGUF file name in it or None). `model` may be a .gguf file itself."""
    path = Path(model).expanduser()
    if gguf_file is None and path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file {path} does not exist")
        return path.parent, path.name
    if gguf_file is not None:
        if not (path / gguf_file).is_file():
            raise ValueError(f"gguf_file={gguf_file!r} is not a file in {path}")
        return path, gguf_file
    return resolve_model_dir(model), None


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


def load_tokenizer(model_dir: Path, gguf_file: str | None, tokenizer: str | None = None):
    """The model's tokenizer, or `tokenizer` (a folder or hub id: vLLM's option) when given."""
    from transformers import AutoTokenizer

    if tokenizer is not None:
        folder = Path(tokenizer).expanduser()  # a tokenizer's folder need not hold a config.json
        return AutoTokenizer.from_pretrained(folder if folder.is_dir() else resolve_model_dir(tokenizer))
    return read_from_gguf(AutoTokenizer, model_dir / gguf_file) if gguf_file else AutoTokenizer.from_pretrained(model_dir)


def eos_token_ids(model_dir: Path, tokenizer) -> set[int]:
    """generation_config.json's end-of-sequence ids (one or a list) and the tokenizer's."""
    path = model_dir / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
    return (set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}) - {None}


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (x86 AVX512-BF16 or AMX, Arm BF16), asked at run time.

    Where it does, a bfloat16 matmul runs several times as fast as the float32 one and every weight and
    KV read moves half the bytes; elsewhere bfloat16 is emulated and slower than float32 (`make bench`
    runs both dtypes).
    """
    caps = torch.cpu.get_capabilities()
    return any(caps.get(flag, False) for flag in ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16"))


def pick_dtype(device: torch.device, dtype: str | torch.dtype | None) -> tuple[torch.dtype, str]:
    """(dtype, why): the one asked for, or for "auto" the fastest this device computes in natively."""
    if isinstance(dtype, torch.dtype):
        return dtype, "asked for"
    if dtype in (None, "auto"):
        if device.type == "cuda":
            if torch.cuda.is_bf16_supported():
                return torch.bfloat16, "auto: the GPU supports bfloat16"
            return torch.float16, "auto: the GPU lacks bfloat16"
        if cpu_has_native_bf16():
            return torch.bfloat16, "auto: the CPU has native bfloat16"
        return torch.float32, "auto: the CPU has no native bfloat16"
    names = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype={dtype!r} is invalid: use one of {sorted(names)} or 'auto'")
    return names[dtype], "asked for"


def load_config(model_dir: Path, gguf_file: str | None = None):
    from transformers import AutoConfig

    config = _gguf_config(model_dir / gguf_file) if gguf_file else AutoConfig.from_pretrained(model_dir)
    if config.model_type not in SUPPORTED:
        raise ValueError(f"model_type {config.model_type!r} is not supported; nano_infer runs {sorted(SUPPORTED)}")
    return config


def _gguf_config(path: Path):
    """transformers' reading of a GGUF file's config, completed from the file (`gguf.complete_config`)."""
    from transformers import AutoConfig

    from .gguf import complete_config

    try:
        config = read_from_gguf(AutoConfig, path)
    except ValueError as e:  # an architecture transformers has no config mapping for
        raise ValueError(f"{path}: transformers reads no config from this GGUF file ({e}), and nano_infer takes "
                         "a GGUF file's config from transformers: use the model's safetensors checkpoint") from e
    return complete_config(config, path)


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


def safetensors_tensors(model_dir: Path, device: torch.device, config=None, model=None, tp=None):
    """(HF name, tensor) for every tensor of the checkpoint's safetensors files, read onto `device` (Mixtral's
    expert names as Qwen3-MoE's: checkpoint_names.canonical); with `tp` (a TPShard) only this rank's slice of each."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {model_dir}")
    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for hf_name in f.keys():
                renamed = canonical(hf_name)
                name = renamed.removeprefix("model.")
                if tp is None or tp.holds(name, config):
                    yield renamed, _read(f, hf_name, name, config, model, tp)


def _read_all(tensors, model, device, dtype, mode: str, experts: tuple[int, int] = (0, 0)) -> dict:
    """Our name -> tensor (or quantized weight): q/k/v, gate/up and each layer's experts fused, and with mode
    "int8" / "int4" each linear weight quantized as soon as its parts are all read."""
    shards: dict[str, list] = {}
    state = {}
    for hf_name, tensor in tensors:
        name, index, count = fused_name(hf_name, experts)
        if name == "lm_head.weight" and model.tie_word_embeddings:
            continue
        if isinstance(tensor, torch.Tensor):
            tensor = tensor.to(device=device, dtype=dtype)
        if index is not None:
            parts = shards.setdefault(name, [None] * count)
            parts[index] = tensor
            if any(p is None for p in parts):
                continue
            tensor = whole(name, shards.pop(name))
        if mode in ("int8", "int4") and name.endswith("_proj.weight"):
            tensor = quantize_weight(tensor, mode)
        linear = name.endswith("_proj.weight") or name == "lm_head.weight"  # a GGUF file's untied head, as stored too
        state[name] = quantized_linear(tensor, dtype) if linear and not isinstance(tensor, torch.Tensor) else tensor
    if shards:
        raise ValueError(f"checkpoint is missing part of {sorted(shards)[:3]}")
    return state


def load_model(model_dir: Path, config, device: torch.device, dtype: torch.dtype, max_positions: int, tp=None,
               gguf_file: str | None = None, quantization: str | None = None):
    """The model on `device` in `dtype`; with `tp` (a TPShard) only that rank's slices of the weights.
    `quantization` (EngineConfig's) says how the weights are held; `model.quantization` is what it resolved to and
    `model.weights_held` says it in words."""
    from accelerate import init_empty_weights

    from .gguf import gguf_tensors
    from .llama import CausalLM
    from .packed import can_pack, pack_linears

    mode, why = resolve_quantization(quantization, gguf_file, device, dtype)
    with init_empty_weights(include_buffers=False):
        model = CausalLM(config, max_positions=max_positions, tp=tp)
    model.rotary.to(device)
    if gguf_file and tp is not None:
        raise ValueError("a GGUF checkpoint with tensor_parallel_size > 1 is not supported; use the safetensors one")
    dequantized = Counter()
    if gguf_file:
        path = model_dir / gguf_file
        tensors = gguf_tensors(path, config, dequantized, as_stored=mode == "gguf")
    else:
        tensors = safetensors_tensors(model_dir, device, config, model, tp)
    experts = tp.experts(config) if tp else (0, num_experts(config))
    state = _read_all(tensors, model, device, dtype, mode, experts)
    held = install_quantized(model, state, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"checkpoint/model mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if can_pack(device, dtype):
        pack_linears(model)
    model.weights_held = describe_weights(mode, why, held, dequantized, dtype)
    model.quantization = mode  # "gguf", "int8", "int4" or "none"
    del state, tensors
    release_freed_memory()
    return model.eval()


def release_freed_memory() -> None:
    """Hand the heap that loading freed back to the OS. Reading a file allocates and frees a tensor at a time,
    and glibc keeps freed pages for reuse: without this the process keeps what loading freed on top of its
    tensors for as long as it runs."""
    if sys.platform == "linux":
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # musl and other libcs: nothing to trim this way
            pass
