"""The engine options that `generate` and `serve` share, and the LLMEngine keyword arguments they become.

A module of their own, so that cli.py (generate) and cli_serve.py (serve) both import them and
neither imports the other. Defaults and choices come from EngineConfig and nano_infer.config's
tuples: the command line cannot drift from the Python API.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..config import (ATTENTIONS, KV_CACHE_DTYPES, KV_CACHES, OFFLOADING_BACKENDS, PREEMPTION_MODES, PREFIX_CACHES,
                      QUANTIZATIONS, EngineConfig)
from ..constrained.backends import BACKENDS, backend_of

_DEFAULTS = {f.name: f.default for f in fields(EngineConfig)}

# EngineConfig field -> add_argument keywords besides the default; --help lists them in this order.
# `model` is LLMEngine's first argument, the rest its keyword arguments.
_OPTIONS = {
    "model": dict(help="hub id, local folder or .gguf file (default: NANO_INFER_MODEL, "
                       "Qwen2.5-1.5B-Instruct on CUDA, else the model shipped in the package)"),
    "dtype": dict(help="auto | float32 | bfloat16 | float16"),
    "device": dict(help="cpu | cuda (default: cuda if available)"),
    "quantization": dict(choices=[q for q in QUANTIZATIONS if q], help="how weights are held (default: a GGUF file "
                         "as stored on a CPU in bfloat16, else dequantized; none: dequantized; gguf: as stored, on "
                         "CPU); int8/int4: quantize at load"),
    "kv_cache": dict(choices=KV_CACHES, help="where K/V lives"),
    "kv_cache_dtype": dict(choices=KV_CACHE_DTYPES, help="how the paged pool stores K/V: auto (the model's dtype) "
                           "or 8 bits with a scale per token and head (int8, fp8 = fp8_e4m3, fp8_e5m2): ~2x the "
                           "tokens of bfloat16 in the same memory"),
    "block_size": dict(type=int, help="tokens per KV block"),
    "prefix_cache": dict(help="prefix reuse (auto: radix when paged)"),
    "attention": dict(choices=ATTENTIONS, help="how attention reads the paged pool"),
    "max_model_len": dict(type=int, help="longest sequence (default: the model's)"),
    "max_num_seqs": dict(type=int, help="most sequences in one step"),
    "tensor_parallel_size": dict(type=int, help="ranks that each hold a shard of the model (worker processes here, "
                                                "or torchrun's ranks)"),
    "enable_expert_parallel": dict(action="store_true", help="a Mixture-of-Experts model under "
                                   "--tensor-parallel-size: each rank whole experts (default: a slice of every expert)"),
    "kv_offloading_size": dict(type=float, help="GiB of host memory for a second KV tier (evicted prefix blocks "
                                                "and swapped-out sequences), summed over tensor-parallel ranks; 0: off"),
    "kv_offloading_backend": dict(choices=OFFLOADING_BACKENDS, help="how the host tier is kept"),
    "preemption_mode": dict(choices=PREEMPTION_MODES, help="recompute | swap | auto (the cheaper by measured rates); "
                                                          "default: auto with a host tier, else recompute"),
    # vLLM's flags under vLLM's names, so a `vllm serve` command line ports (`generate --seed` is the request's)
    "tokenizer": dict(help="a folder or hub id of the tokenizer (default: the model's)"),
    "chat_template": dict(help="a Jinja chat template: a file, its text, or a shipped one by name (chatml_tools: "
                               "OpenAI tools for ChatML models such as SmolLM2 and Qwen; default: the model's)"),
    "enable_prefix_caching": dict(action=argparse.BooleanOptionalAction,
                                  help="--no-enable-prefix-caching turns the prefix cache off (--prefix-cache none)"),
    "enforce_eager": dict(action=argparse.BooleanOptionalAction,
                          help="decode eagerly: no CUDA graphs, no compiled CPU step (default: CUDA graphs on CUDA, the CPU "
                               "decode step of up to 4 sequences compiled for 4- and 8-bit weights; "
                               "--no-enforce-eager compiles it whatever the weights)"),
    "compilation_config": dict(help="JSON, as vLLM's; one key here: '{\"compile_sizes\": [1, 2, 4, 8, 16, 32]}', the "
                                    "batch sizes the CPU decode step is compiled for (default: 1, 2 and 4), each "
                                    "compiled before the server answers"),
    "trust_remote_code": dict(action="store_true", help="accepted: no checkpoint code runs here"),
    "speculative_config": dict(help="JSON, as vLLM's: "
                                    '\'{"method": "ngram", "num_speculative_tokens": 4}\' or '
                                    '\'{"method": "draft_model", "model": "<dir or hub id>", "num_speculative_tokens": 3}\''),
}


def _prefix_cache_flag(value: str | None) -> str:
    """prefix_cache=None (no reuse) is spelled "none" on the command line."""
    return "none" if value is None else value


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """--kv-cache for EngineConfig.kv_cache, and so on: the flag is the field's name with dashes."""
    for name, kwargs in _OPTIONS.items():
        default = _DEFAULTS[name]
        if name == "prefix_cache":
            default = _prefix_cache_flag(default)
            kwargs = dict(kwargs, choices=[_prefix_cache_flag(c) for c in PREFIX_CACHES])
        p.add_argument("--" + name.replace("_", "-"), default=default, **kwargs)
    p.add_argument("--structured-outputs-backend", "--structured-outputs-config.backend", "--structured-outputs-config",
                   dest="structured_outputs_config", type=_structured_outputs_config, default=None, metavar="BACKEND",
                   help="who compiles constraints (vLLM's structured_outputs_config backend, by name or as JSON): "
                        "guidance (llguidance: also GBNF/Lark grammars and structural tags), nano (chapter 07's "
                        "regex -> DFA -> token masks), auto (default: llguidance for grammars and structural tags, "
                        "the DFA for the rest)")


def _structured_outputs_config(value: str) -> dict:
    """`guidance` or vLLM's JSON `{"backend": "guidance"}`: the engine's structured_outputs_config."""
    try:
        config = json.loads(value) if value.lstrip().startswith("{") else {"backend": value}
        backend_of(config)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: {e}; backends: {', '.join(BACKENDS)}") from None
    return config


def engine_kwargs(args: argparse.Namespace) -> dict:
    """LLMEngine's keyword arguments (all but `model`) from parsed engine options."""
    kwargs = {name: getattr(args, name) for name in _OPTIONS if name != "model"}
    if kwargs["prefix_cache"] == "none":
        kwargs["prefix_cache"] = None
    if getattr(args, "structured_outputs_config", None) is not None:
        kwargs["structured_outputs_config"] = args.structured_outputs_config
    for name in ("speculative_config", "compilation_config"):
        text, kwargs[name] = kwargs[name], None
        if text:
            try:
                kwargs[name] = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"--{name.replace('_', '-')} is not valid JSON: {e}") from None
    return kwargs
