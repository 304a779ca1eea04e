"""How an OpenAI request body becomes SamplingParams: what each field means, what is refused (400 naming it).

Constrained output can be asked for three ways, all with vLLM's meaning: OpenAI's
`response_format`, vLLM's `guided_regex` / `guided_json` / `guided_choice`, and newer vLLM's
`structured_outputs: {"regex" | "json" | "choice" | "grammar" | "structural_tag": ...}` (and `guided_grammar`).
At most one constraint per request; a grammar llguidance cannot take is a 400 naming the field that carried it.
"""
from __future__ import annotations

import json
import logging

from .protocol import JSON_OBJECT, ChatBody, CompletionBody, ProtocolError, json_text
from .tools import tool_plan
from ..sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Fields OpenAI or vLLM define that nano_infer does not implement, with the values that change nothing.
NEUTRAL = {"suffix": ("",), "guided_whitespace_pattern": (), "spaces_between_special_tokens": (True,),
           "truncate_prompt_tokens": ()}
# ... on one route only: a chat's `echo` (vLLM's: the reply prefixed with the last message) and its
# `add_special_tokens` (the template writes them), a completion's `add_special_tokens` (the tokenizer's are added)
NEUTRAL_ON = {ChatBody: {"echo": (False,), "chat_template": (), "documents": (), "add_special_tokens": (False,)},
              CompletionBody: {"add_special_tokens": (True,)}}
# why a field is refused, where that says more than "not supported"
WHY = {"chat_template": "a client's template would run on the server for every tenant; the server renders the one it "
                        "started with (--chat-template), as vLLM does without --trust-request-chat-template"}
# Fields that change no output of this server: accepted and logged (vLLM's behaviour); parallel_tool_calls only
# without tools
IGNORED = ("store", "metadata", "service_tier", "parallel_tool_calls", "user")
# SamplingParams' logits rules, with the value that turns each off (beam search refuses the others)
LOGITS_RULES = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0,
                "min_tokens": 0, "logit_bias": None, "bad_words": None, "allowed_token_ids": None}


def check_unsupported(body) -> None:
    """Fields nano_infer does not implement are refused unless neutral (400 naming the field)."""
    for name, neutral in {**NEUTRAL, **NEUTRAL_ON.get(type(body), {})}.items():
        value = getattr(body, name, None)
        if value is not None and value not in neutral:
            raise ProtocolError(f"{name}={_short(value)} is not supported by this server"
                                + (f" ({WHY[name]})" if name in WHY else "") + "; leave it out"
                                + (f" or send {neutral[0]!r}" if neutral else ""), param=name)
    if isinstance(body, CompletionBody) and body.best_of not in (None, body.n):
        raise ProtocolError("best_of is not supported (only best_of == n)", param="best_of")
    ignored = [name for name in IGNORED if getattr(body, name, None) is not None
               and not (name == "parallel_tool_calls" and getattr(body, "tools", None))]  # with tools it counts
    if ignored:
        logger.info("fields that change nothing on this server, ignored: %s", ", ".join(ignored))


def logit_bias(body) -> dict[int, float] | None:
    """OpenAI's logit_bias has token ids as JSON keys, so as text: "42" -> 42."""
    if body.logit_bias is None:
        return None
    try:
        return {int(k): v for k, v in body.logit_bias.items()}
    except ValueError:
        raise ProtocolError("logit_bias: keys must be token ids (as strings: {\"42\": -100})", param="logit_bias") from None


def sampling_params(body, max_tokens: int | None, logprobs: int | None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The SamplingParams `body` asks for; ProtocolError (400) for anything it cannot honour."""
    check_unsupported(body)
    for name, default in (("length_penalty", 1.0), ("early_stopping", False)):
        if getattr(body, name) != default:
            raise ProtocolError(f"{name} applies to beam search only: send use_beam_search: true", param=name)
    regex, schema, choice, grammar, structural_tag = constraint_fields(body)
    bias = logit_bias(body)
    try:
        return SamplingParams(n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                              max_tokens=max_tokens, stop=body.stop, seed=body.seed, ignore_eos=body.ignore_eos,
                              stop_token_ids=body.stop_token_ids, skip_special_tokens=body.skip_special_tokens,
                              regex=regex, json_schema=schema, choice=choice, grammar=grammar,
                              structural_tag=structural_tag, logprobs=logprobs,
                              prompt_logprobs=prompt_logprobs, frequency_penalty=body.frequency_penalty,
                              presence_penalty=body.presence_penalty, repetition_penalty=body.repetition_penalty,
                              min_p=body.min_p, min_tokens=body.min_tokens, logit_bias=bias,
                              bad_words=body.bad_words, allowed_token_ids=body.allowed_token_ids,
                              include_stop_str_in_output=body.include_stop_str_in_output)
    except ValueError as e:
        raise ProtocolError(str(e).replace("SamplingParams.", ""), param=_param_of(str(e))) from e


def constraint_fields(body) -> tuple:
    """(regex, json_schema, choice, grammar, structural_tag) from whichever way the body used; at most one."""
    asked = []  # (field, regex, schema, choice, grammar, structural_tag)
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ProtocolError("response_format: type 'json_schema' needs a 'json_schema': {'schema': {...}}",
                                param="response_format")
        asked.append(("response_format", None, fmt.json_schema.schema_, None, None, None))
    elif fmt is not None and fmt.type == "json_object":
        asked.append(("response_format", None, JSON_OBJECT, None, None, None))
    elif fmt is not None and fmt.type == "structural_tag":
        tag = {"structures": fmt.structures, "triggers": fmt.triggers}
        asked.append(("response_format", None, None, None, None, _grammar(tag, "structural_tag", "response_format")))
    if body.guided_regex is not None:
        asked.append(("guided_regex", body.guided_regex, None, None, None, None))
    if body.guided_json is not None:
        asked.append(("guided_json", None, _schema(body.guided_json, "guided_json"), None, None, None))
    if body.guided_choice is not None:
        asked.append(("guided_choice", None, None, body.guided_choice, None, None))
    if body.guided_grammar is not None:
        asked.append(("guided_grammar", None, None, None, _grammar(body.guided_grammar, "grammar", "guided_grammar"),
                      None))
    so = body.structured_outputs
    if so is not None:
        given = [k for k in ("regex", "json_", "choice", "json_object", "grammar", "structural_tag")
                 if getattr(so, k) not in (None, False)]
        if len(given) != 1:
            raise ProtocolError("structured_outputs needs exactly one of regex, json, choice, json_object, grammar, "
                                "structural_tag", param="structured_outputs")
        schema = JSON_OBJECT if so.json_object else _schema(so.json_, "structured_outputs.json") \
            if so.json_ is not None else None
        grammar, tag = (_grammar(getattr(so, k), k, "structured_outputs") if getattr(so, k) is not None else None
                        for k in ("grammar", "structural_tag"))
        asked.append(("structured_outputs", so.regex, schema, so.choice, grammar, tag))
    plan = tool_plan(body) if isinstance(body, ChatBody) else None
    if plan is not None and plan.schema is not None:  # tool_choice "required" or a named function
        asked.append(("tool_choice", None, plan.schema, None, None, None))
    if len(asked) > 1:
        raise ProtocolError(f"give one constraint per request (got {', '.join(a[0] for a in asked)})", param=asked[1][0])
    return asked[0][1:] if asked else (None,) * 5


def _grammar(value, kind: str, field: str) -> str:
    """A grammar or structural tag llguidance takes, as text; a 400 naming `field` otherwise."""
    from ..constrained.grammar_backend import check_grammar  # llguidance loads with the first grammar
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    try:
        check_grammar(kind, text)
    except ValueError as e:
        raise ProtocolError(f"{field}: {e}", param=field) from None
    return text


def _schema(value, field: str):
    return json_text(value, field) if isinstance(value, str) else value


def _param_of(message: str) -> str | None:
    """The field a SamplingParams error names ("SamplingParams.top_k=... is invalid")."""
    head = message.removeprefix("SamplingParams.").split("=", 1)[0]
    return head if head.isidentifier() else None


def _short(value, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
