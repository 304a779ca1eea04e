"""A request body read, parsed and validated off the event loop, in its tenant's turn.

FastAPI parses a body on the event loop, where a large body of unknown keys (pydantic reports
each one) pauses every other stream for as long as it takes. Here the body is parsed by the
server's workers after the key was checked (guard.py), queued per tenant and paced (FairQueue),
so a client that sends many at once queues, and slows, only itself. Before pydantic
sees it, a body is bounded in object keys and depth (ServerLimits), and every list in the models
is capped (protocol.Capped), which keeps the slowest parse near json.loads of 4 MB (~0.2 s).
NaN and Infinity, which Python's json reads, are refused by the fields (protocol.Number) and by
the JSON Schema compiler.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..async_engine.fair_queue import FairQueue
from .errors import APIError, invalid_field
from .limits import ServerLimits

T = TypeVar("T")


class BodyParser:
    def __init__(self, limits: ServerLimits, work: FairQueue):
        self.limits, self.work = limits, work

    async def parse(self, request: Request, model: type[BaseModel],
                    build: Callable[[BaseModel], T]) -> tuple[BaseModel, T]:
        """The body as `model`, and `build(body)`: what the route makes of it (its prompts, its sampling
        parameters), in the same worker turn. Building reads JSON carried inside fields (a schema as a
        string, tool calls' arguments) and dumps the tools for the template: work a client sizes, kept
        off the event loop that every other stream's chunks pass through."""
        raw = await request.body()
        return await self.work.run(request.state.tenant.name, self._parse_and_build, raw, model, build)

    def _parse_and_build(self, raw: bytes, model: type[BaseModel],
                         build: Callable[[BaseModel], T]) -> tuple[BaseModel, T]:
        body = self._parse(raw, model)
        return body, build(body)

    def _parse(self, raw: bytes, model: type[BaseModel]) -> BaseModel:
        try:
            data = json.loads(raw)
        except RecursionError:
            raise APIError(400, f"the request body nests deeper than {self.limits.max_body_depth} levels") from None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise APIError(400, f"the request body is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise APIError(400, "the request body must be a JSON object, sent with Content-Type: application/json")
        self._check_shape(data)
        try:
            return model.model_validate(data)
        except ValidationError as e:
            raise invalid_field(_most_telling(e.errors(include_url=False, include_context=False, include_input=False))) from None

    def _check_shape(self, data: dict) -> None:
        """At most max_body_keys object keys in all, nested at most max_body_depth levels, and no string (key or
        value) with a lone surrogate: `\\ud800` is valid JSON but no text, and failed wherever it was encoded
        (a model name echoed in a 404, a cache_salt) with a 500."""
        keys, stack = 0, [(data, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > self.limits.max_body_depth:
                raise APIError(400, f"the request body nests deeper than {self.limits.max_body_depth} levels")
            items = node.values() if isinstance(node, dict) else node
            if isinstance(node, dict):
                keys += len(node)
                _check_text(node.keys())
            if keys > self.limits.max_body_keys:
                raise APIError(400, f"the request body has more than {self.limits.max_body_keys:,} object keys")
            _check_text(child for child in items if isinstance(child, str))
            stack.extend((child, depth + 1) for child in items if isinstance(child, (dict, list)))


def _check_text(strings) -> None:
    for text in strings:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise APIError(400, "the request body has a lone surrogate (\\ud800-\\udfff) in a string: not valid "
                                    "Unicode text") from None


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _most_telling(errors: list[dict]) -> dict:
    """One error to report: in a union (`stop`: a string or a list of strings) the branch that got
    furthest, not "should be a string"; its location without the union's branch names."""
    err = next((e for e in errors if not e["type"].endswith("_type")), errors[0])
    loc = [part for part in err["loc"] if isinstance(part, int) or not (part in _TYPE_TAGS or set(part) & set("[]-"))]
    return {**err, "loc": loc}
