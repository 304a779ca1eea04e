"""Which engine compiles a constraint: vLLM's `structured_outputs_config={"backend": ...}`.

- "nano": chapter 07's regex -> byte DFA -> token masks (the teaching path): regex, JSON Schema, choice.
- "guidance": llguidance (grammar_backend): those three, plus `grammar` (GBNF or Lark) and `structural_tag`.
- "auto" (the default): llguidance for what only it takes (grammar, structural_tag), the DFA for the rest,
  whose behaviour (fixed JSON layout, the limits and refusals chapter 07 documents) the rest of the package
  and its tests rely on.

vLLM's other names ("xgrammar", "outlines", "lm-format-enforcer") are refused by name: those libraries are
not dependencies here. This module imports no backend, so choosing costs nothing at start-up.
"""
from __future__ import annotations

import json

BACKENDS = ("auto", "guidance", "nano")
LIBRARY_KINDS = ("grammar", "structural_tag")


def backend_of(config) -> str:
    """The backend an engine's `structured_outputs_config` names: None, a dict or JSON text (`--structured-outputs-config`),
    or an object with a `backend` attribute (vLLM's StructuredOutputsConfig)."""
    if config is None:
        return "auto"
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise ValueError(f"structured_outputs_config is not JSON: {e}") from None
    backend = config.get("backend", "auto") if isinstance(config, dict) else getattr(config, "backend", None)
    if backend not in BACKENDS:
        raise ValueError(f"structured_outputs_config backend={backend!r} must be one of {', '.join(BACKENDS)} "
                         f"(guidance is llguidance, nano chapter 07's DFA; xgrammar is not installed here)")
    return backend


def backend_for(kind: str, backend: str) -> str:
    """"guidance" or "nano" for a constraint of `kind` (regex, json_schema, choice, grammar, structural_tag)."""
    if kind in LIBRARY_KINDS:
        if backend == "nano":
            raise ValueError(f"{kind} needs a grammar engine: structured_outputs_config backend 'nano' (chapter 07's "
                             f"DFA) takes regex, json and choice; use 'auto' or 'guidance'")
        return "guidance"
    return "guidance" if backend == "guidance" else "nano"
