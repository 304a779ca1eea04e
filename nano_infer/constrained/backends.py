"""Which engine compiles a constraint: vLLM's `structured_outputs_config={"backend": ...}`.

- "nano": chapter 07's regex -> byte DFA -> token masks (the teaching path): regex, JSON Schema, choice.
- "guidance": llguidance (grammar_backend): those three, plus `grammar` (GBNF or Lark) and `structural_tag`.
- "auto" (the default), vLLM's meaning (its first engine, falling back to the next for what the first does
  not take): the DFA for a regex, JSON Schema or choice it expresses and compiles fast; llguidance for grammar
  and structural_tag, for what the DFA refuses as unsupported (a recursive $ref, `format`, `multipleOf`, a
  Unicode property class in a regex, ...: backends.Unsupported) and for what dfa_cost estimates would take
  more than about a second to compile (long `maxLength` / `maxItems` bounds, any-object `json_object`). The
  limits that protect a server (a constraint's size, its nesting, its regex's length) refuse it whichever
  backend would compile it.

vLLM's other names ("xgrammar", "outlines", "lm-format-enforcer") are refused by name: those libraries are
not dependencies here. This module imports no backend, so choosing costs nothing at start-up.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

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
    """"guidance" or "nano" for a constraint of `kind` (regex, json_schema, choice, grammar, structural_tag);
    under "auto", "nano" means the DFA's compile, which may answer ToLibrary."""
    if kind in LIBRARY_KINDS:
        if backend == "nano":
            raise ValueError(f"{kind} needs a grammar engine: structured_outputs_config backend 'nano' (chapter 07's "
                             f"DFA) takes regex, json and choice; use 'auto' or 'guidance'")
        return "guidance"
    return "guidance" if backend == "guidance" else "nano"


@dataclass(frozen=True)
class ToLibrary:
    """What "auto" answers instead of a DFA index for a constraint llguidance should compile; `why` says which
    rule sent it there (unsupported, and what, or its estimated cost)."""

    why: str


class Unsupported(ValueError):
    """A regex or JSON Schema that is valid but outside what chapter 07's DFA expresses (a lookaround, a recursive
    $ref, a schema keyword json_schema.py does not list, ...): "nano" refuses it, naming what; "auto" hands it to
    llguidance (constraint.compile_index)."""
