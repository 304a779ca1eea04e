"""vLLM's structured-output parameters: `SamplingParams(structured_outputs=StructuredOutputsParams(json=...))`
and the older `SamplingParams(guided_decoding=GuidedDecodingParams(...))`, mapped onto the constraints
this package builds (regex, JSON Schema, choice). Both import from nano_infer.sampling_params, as in vLLM.

A context-free `grammar` (GBNF or Lark) and a `structural_tag` go to llguidance (backends.py); a
`whitespace_pattern` is refused by name rather than ignored (the JSON layout is fixed, json_schema.py). The
layout has no free whitespace at all, so `disable_any_whitespace` holds already; properties a schema does
not list are never produced, so `disable_additional_properties` holds too; the backend is the engine's
(`structured_outputs_config`); "auto" hands llguidance only what the DFA does not express or would compile
slowly (backends.py), never a constraint the DFA refused as invalid, and `disable_fallback` changes nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

JSON_OBJECT = {"type": "object"}  # json_object: any JSON object
CONSTRAINT_FIELDS = ("regex", "json_schema", "choice", "grammar", "structural_tag")  # SamplingParams' own


@dataclass
class StructuredOutputsParams:
    json: str | dict | Any | None = None  # a JSON Schema (dict or JSON text) or a pydantic model class
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        if self.whitespace_pattern is not None:
            raise ValueError(f"{type(self).__name__}.whitespace_pattern is not supported: the JSON layout is fixed "
                             f"(json.dumps' spacing)")
        given = [k for k in ("json", "regex", "choice", "json_object", "grammar", "structural_tag")
                 if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"{type(self).__name__}: give exactly one of json, regex, choice, json_object, grammar, "
                             f"structural_tag (got {given or 'none'})")
        for kind in ("grammar", "structural_tag"):
            text = getattr(self, kind)
            if text is not None:  # checked here, as vLLM does, so a bad grammar fails where it was written
                from .grammar_backend import check_grammar  # llguidance loads with the first grammar
                check_grammar(kind, text if isinstance(text, str) else json.dumps(text))

    def constraint(self) -> dict:
        """SamplingParams' own fields for this constraint: one of CONSTRAINT_FIELDS."""
        if self.json_object:
            return {"json_schema": JSON_OBJECT}
        if self.json is not None:
            return {"json_schema": self.json}
        if self.choice is not None:
            return {"choice": list(self.choice)}
        return {k: getattr(self, k) for k in ("regex", "grammar", "structural_tag") if getattr(self, k) is not None}


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name (`guided_decoding=`); `backend` picks nothing here: there is one."""

    backend: str | None = None
    backend_was_auto: bool = False
