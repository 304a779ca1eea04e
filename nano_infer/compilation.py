"""vLLM's `compilation_config`, the one key of it this engine takes: `compile_sizes`, the batch sizes a CPU's
compiled decode step is built for (engine/compiled_decode.py; 1, 2 and 4 when none are asked for). Checked with
the rest of EngineConfig, before anything loads."""
from __future__ import annotations

# the settings the compiled step runs with (engine/build.py decodes eagerly under any other)
COMPILED_STEP = dict(kv_cache="paged", kv_cache_dtype="auto", attention="gather", tensor_parallel_size=1)


def compile_sizes(config) -> tuple[int, ...] | None:
    """The batch sizes an EngineConfig's compilation_config asks for, sorted (None: it asks for none); a ValueError
    that says why for one this engine cannot honour."""
    options = config.compilation_config
    if options is None:
        return None
    if not isinstance(options, dict) or set(options) - {"compile_sizes"}:
        raise ValueError(f"compilation_config={options!r}: the one key taken here is 'compile_sizes', the batch "
                         f"sizes a CPU's compiled decode step is built for, e.g. {{'compile_sizes': [1, 2, 4, 8]}}")
    sizes = options.get("compile_sizes")
    if (not isinstance(sizes, (list, tuple)) or not sizes
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes)):
        raise ValueError(f"compilation_config['compile_sizes']={sizes!r} must be a list of batch sizes >= 1")
    if max(sizes) > config.max_num_seqs:
        raise ValueError(f"compilation_config['compile_sizes'] has {max(sizes)}, more sequences than a step holds "
                         f"(max_num_seqs={config.max_num_seqs})")
    if config.enforce_eager:
        raise ValueError("compilation_config['compile_sizes'] sizes the compiled decode step, and "
                         "enforce_eager=True turns it off: set one or the other")
    other = {name: getattr(config, name) for name, value in COMPILED_STEP.items() if getattr(config, name) != value}
    if other:
        raise ValueError(f"compilation_config['compile_sizes'] sizes the compiled decode step, which runs with "
                         f"{', '.join(f'{k}={v!r}' for k, v in COMPILED_STEP.items())}; got "
                         f"{', '.join(f'{k}={v!r}' for k, v in other.items())}")
    return tuple(sorted(set(sizes)))
