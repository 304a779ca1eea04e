"""vLLM's EngineArgs, AsyncEngineArgs and FlexibleArgumentParser, so a vLLM script's command line ports:

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)                      # --model, --max-model-len, --enable-prefix-caching ...
    engine_args = EngineArgs.from_cli_args(parser.parse_args())
    llm = LLM(**dataclasses.asdict(engine_args))         # or LLMEngine.from_engine_args(engine_args)

EngineArgs' fields are EngineConfig's (the options this engine has, under vLLM's names where vLLM has
them), then vLLM's options that change nothing here (engine/vllm_options.py): accepted at their neutral
value, a ValueError naming the option otherwise. The flags are cli/engine_args.py's (what `nano-infer
serve` takes), plus one per remaining field. vLLM's import paths lead here too: `nano_infer.engine.arg_utils`
and `nano_infer.utils` / `nano_infer.utils.argparse_utils` are names for this module (registered at import:
the engine's layer may not import the command line's, so no file there imports up).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, dataclass, field, fields, make_dataclass

from ..config import POLICIES, SCHEDULERS, EngineConfig
from ..engine.vllm_options import ASYNC_ONLY, NEUTRAL_OPTIONS, drop_neutral_options
from .engine_args import _OPTIONS, add_engine_args, engine_kwargs


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vLLM's parser: `--max_model_len 128` is `--max-model-len 128` (underscores in a flag's name are dashes),
    `--flag=value` as argparse takes it."""

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([_dashed(a) for a in args], namespace)


def _dashed(arg: str) -> str:
    if not arg.startswith("--") or arg == "--":
        return arg
    key, eq, value = arg.partition("=")
    return key.replace("_", "-") + eq + value


# flags for the EngineConfig fields cli/engine_args.py has none for: a type where the default is None
_TYPES = {"seed": int, "num_kv_blocks": int, "kv_cache_memory": int, "gguf_file": str, "distributed_backend": str}
_CHOICES = {"scheduler": SCHEDULERS, "scheduler_policy": POLICIES}
_NO_FLAG = {"constraint_limits", "hf_overrides", "logits_processors"}  # objects, not flags


class _EngineArgsMethods:
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Every field as a flag (`--max-model-len`); flags the parser has already are left as they are."""
        if "--model" not in parser._option_string_actions:
            add_engine_args(parser)
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.name in _OPTIONS or f.name in _NO_FLAG or flag in parser._option_string_actions:
                continue
            if isinstance(f.default, bool):
                parser.add_argument(flag, default=f.default, action=argparse.BooleanOptionalAction)
            else:
                kind = _TYPES.get(f.name) or (type(f.default) if f.default is not None else str)
                parser.add_argument(flag, default=f.default, type=kind, choices=_CHOICES.get(f.name))
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        """The EngineArgs of parsed flags (a field without a flag keeps its default)."""
        values = {f.name: getattr(args, f.name, f.default) for f in fields(cls)}
        if all(hasattr(args, name) for name in _OPTIONS):
            values.update(engine_kwargs(args), model=args.model)  # "none" prefix cache, JSON speculative_config
        return cls(**values)

    def create_engine_config(self) -> EngineConfig:
        """The EngineConfig these arguments make (checked; vLLM's no-op options must be at their neutral value)."""
        options = drop_neutral_options({f.name: getattr(self, f.name) for f in fields(self)})
        return EngineConfig.from_kwargs(options.pop("model"), **options)


def _fields(neutral: list[str]) -> list[tuple]:
    own = [(f.name, f.type, field(default=f.default)) for f in fields(EngineConfig) if f.default is not MISSING]
    return own + [(name, "typing.Any", field(default=NEUTRAL_OPTIONS[name][0][0])) for name in neutral]


EngineArgs = make_dataclass("EngineArgs", _fields([n for n in NEUTRAL_OPTIONS if n not in ASYNC_ONLY]),
                            bases=(_EngineArgsMethods,))
EngineArgs.__module__ = __name__
EngineArgs.__doc__ = "vLLM's EngineArgs: every engine option as a field; `LLM(**dataclasses.asdict(args))` builds it."


@dataclass
class AsyncEngineArgs(EngineArgs):
    """vLLM's AsyncEngineArgs: EngineArgs and whether requests are logged (accepted either way: none are here)."""

    enable_log_requests: bool = False
    disable_log_requests: bool = False


def _register_vllm_paths() -> None:
    this = sys.modules[__name__]
    for path in ("nano_infer.engine.arg_utils", "nano_infer.utils", "nano_infer.utils.argparse_utils"):
        sys.modules.setdefault(path, this)
    sys.modules["nano_infer.engine"].arg_utils = this
    sys.modules["nano_infer"].utils = this


_register_vllm_paths()
