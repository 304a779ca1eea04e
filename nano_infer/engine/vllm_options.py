"""vLLM's engine options that mean nothing in this engine: accepted at their neutral value, refused otherwise.

`LLM(**asdict(EngineArgs(...)))` and `LLMEngine.from_engine_args` hand over every field of vLLM's
EngineArgs; a script that leaves these at vLLM's defaults runs unchanged, and one that sets them gets a
ValueError that names the option and says why, not an engine that silently does something else.
The options nano_infer has (dtype, max_model_len, enable_prefix_caching, ...) are EngineConfig's own.
"""
from __future__ import annotations

# option -> (the values that change nothing here, why another value cannot be honoured)
NEUTRAL_OPTIONS: dict[str, tuple[tuple, str]] = {
    "tokenizer_mode": (("auto", "hf"), "the Hugging Face tokenizer is the only one"),
    "skip_tokenizer_init": ((False,), "the engine detokenizes and applies stop strings itself"),
    "revision": ((None,), "checkpoints load from a folder or the hub's default branch"),
    "code_revision": ((None,), "no checkpoint code runs here"),
    "tokenizer_revision": ((None,), "the tokenizer loads from the model's folder or hub id"),
    "download_dir": ((None,), "the Hugging Face cache is where the hub downloads go"),
    "load_format": (("auto",), "weights load from safetensors or GGUF, as found"),
    "config_format": (("auto",), "config.json (or the GGUF header) is read"),
    "hf_token": ((None,), "use HF_TOKEN in the environment"),
    "hf_overrides": ((None,), "the model's config.json is used as it is"),
    "pipeline_parallel_size": ((1,), "there is no pipeline parallelism; use tensor_parallel_size"),
    "data_parallel_size": ((1,), "run one engine per replica"),
    "distributed_executor_backend": ((None, "mp"), "tensor-parallel ranks are worker processes (torch.distributed)"),
    "disable_custom_all_reduce": ((False, True), None),  # either: all-reduce is torch.distributed's
    "swap_space": ((4, 0), "the host tier is kv_offloading_size (GiB) with preemption_mode='swap'"),
    "cpu_offload_gb": ((0,), "weights stay on the device"),
    "max_logprobs": ((20,), "20 alternatives per token is the limit (OpenAI's)"),
    "served_model_name": ((None,), "a server option here: nano-infer serve --served-model-name"),
    "enable_lora": ((False, None), "LoRA adapters are not supported"),
    "generation_config": (("auto",), "the model's generation_config.json gives the default sampling parameters"),
    "async_scheduling": ((False, None), "steps run one after another"),
    # AsyncEngineArgs' own: whether each request is logged changes no output
    "enable_log_requests": ((False, True), None),
    "disable_log_requests": ((False, True), None),
}
ASYNC_ONLY = ("enable_log_requests", "disable_log_requests")


def drop_neutral_options(options: dict) -> dict:
    """`options` without vLLM's options that change nothing here; ValueError for one set to something else."""
    kept = {}
    for name, value in options.items():
        if name not in NEUTRAL_OPTIONS:
            kept[name] = value
            continue
        neutral, why = NEUTRAL_OPTIONS[name]
        if not any(value is v or (v is not None and isinstance(value, bool) == isinstance(v, bool) and value == v)
                   for v in neutral):
            raise ValueError(f"{name}={value!r} is a vLLM option that nano_infer cannot honour ({why}); leave it at "
                             f"{' or '.join(repr(v) for v in neutral)}")
    return kept
