"""vLLM's structured-output parameters: `SamplingParams(structured_outputs=StructuredOutputsParams(json=...))`
and the older `SamplingParams(guided_decoding=GuidedDecodingParams(...))`, mapped onto the constraints
this package builds (regex, JSON Schema, choice). Both import from nano_infer.sampling_params, as in vLLM.

What the byte DFA cannot do is refused by name rather than ignored: a context-free `grammar` and a
`structural_tag`; a `whitespace_pattern` (the JSON layout is fixed, json_schema.py). The layout has no
free whitespace at all, so `disable_any_whitespace` holds already; properties a schema does not list
are never produced, so `disable_additional_properties` holds too; there is no other backend to fall
back to, so `disable_fallback` changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON_OBJECT = {"type": "object"}  # json_object: any JSON object


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
        refused = {"grammar": "a context-free grammar needs a parser, not a DFA: use regex, json or choice",
                   "structural_tag": "structural tags are not supported",
                   "whitespace_pattern": "the JSON layout is fixed (json.dumps' spacing)"}
        for name, why in refused.items():
            if getattr(self, name) is not None:
                raise ValueError(f"{type(self).__name__}.{name} is not supported: {why}")
        given = [k for k in ("json", "regex", "choice", "json_object") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"{type(self).__name__}: give exactly one of json, regex, choice, json_object "
                             f"(got {given or 'none'})")

    def constraint(self) -> dict:
        """SamplingParams' own fields for this constraint: regex, json_schema or choice."""
        if self.json_object:
            return {"json_schema": JSON_OBJECT}
        if self.json is not None:
            return {"json_schema": self.json}
        return {"regex": self.regex} if self.regex is not None else {"choice": list(self.choice)}


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name (`guided_decoding=`); `backend` picks nothing here: there is one."""

    backend: str | None = None
    backend_was_auto: bool = False
