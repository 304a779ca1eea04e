"""vLLM's prompt forms, so `from vllm.inputs import TokensPrompt` ports by changing the package name.

A prompt is a string, a `TextPrompt` ({"prompt": str}) or a `TokensPrompt` ({"prompt_token_ids": [...]});
both dicts may carry a `cache_salt` (SamplingParams.cache_salt for that prompt alone). They are plain
dicts (TypedDicts), as in vLLM: `TokensPrompt(prompt_token_ids=ids)` is `{"prompt_token_ids": ids}`.
"""
from __future__ import annotations

from typing import TypedDict

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    prompt: str
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
    prompt: NotRequired[str]  # the text the ids came from, returned as RequestOutput.prompt
    cache_salt: NotRequired[str]


PromptType = str | TextPrompt | TokensPrompt


def parse_prompt(prompt) -> tuple[str | None, list[int] | None, str | None]:
    """(text, token ids, cache_salt) of one prompt in any of vLLM's forms; ValueError naming what is wrong.
    Token ids win over the text when a TokensPrompt carries both (the text is only reported back)."""
    if isinstance(prompt, str):
        return prompt, None, None
    if not isinstance(prompt, dict):
        raise ValueError(f"a prompt must be a string, a TextPrompt {{'prompt': str}} or a TokensPrompt "
                         f"{{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")
    unknown = set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"}
    if unknown:
        raise ValueError(f"a prompt must be a string, a TextPrompt or a TokensPrompt: keys {sorted(unknown)} are not "
                         f"supported (multi-modal inputs are not); use 'prompt' or 'prompt_token_ids', and optionally "
                         f"'cache_salt'")
    if "prompt_token_ids" in prompt:
        return prompt.get("prompt"), list(prompt["prompt_token_ids"]), prompt.get("cache_salt")
    if "prompt" in prompt:
        return prompt["prompt"], None, prompt.get("cache_salt")
    raise ValueError("a prompt must be a string, a TextPrompt or a TokensPrompt: a dict needs 'prompt' (text) or "
                     "'prompt_token_ids'")
