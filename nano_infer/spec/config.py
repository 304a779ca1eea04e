"""`speculative_config`: vLLM's dict, parsed and checked before anything is loaded.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    {"method": "draft_model", "model": "path/or/hub-id", "num_speculative_tokens": 4}

A bad field raises ValueError naming the field and why. Whether a draft model fits the target
(same vocabulary and tokenizer) is checked when it is loaded (`draft.check_compatible`).
"""
from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "draft_model")
KEYS = {"ngram": {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"},
        "draft_model": {"method", "num_speculative_tokens", "model"}}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None

    @classmethod
    def parse(cls, config: dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        if config is None or isinstance(config, SpeculativeConfig):
            return config
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(config).__name__}")
        method = config.get("method")
        if method is None and config.get("model") is not None:
            method = "draft_model"
        if method not in METHODS:
            raise ValueError(f"speculative_config method={method!r} is unknown: use one of {list(METHODS)}")
        unknown = set(config) - KEYS[method]
        if unknown:
            raise ValueError(f"speculative_config has field(s) {sorted(unknown)} that method {method!r} "
                             f"does not take; it takes {sorted(KEYS[method])}")
        k = config.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config num_speculative_tokens={k!r} must be an integer >= 1")
        if method == "draft_model":
            model = config.get("model")
            if not isinstance(model, str) or not model:
                raise ValueError("speculative_config method 'draft_model' needs model: a folder or hub id of the draft")
            return cls(method, k, model=model)
        hi, lo = config.get("prompt_lookup_max", 4), config.get("prompt_lookup_min", 1)
        for name, v in (("prompt_lookup_max", hi), ("prompt_lookup_min", lo)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name}={v!r} must be an integer >= 1")
        if lo > hi:
            raise ValueError(f"speculative_config prompt_lookup_min={lo} is larger than prompt_lookup_max={hi}")
        return cls(method, k, prompt_lookup_max=hi, prompt_lookup_min=lo)
