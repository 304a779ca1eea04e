"""vLLM's /tokenize, /detokenize and /version: what a client asks of the server's tokenizer, with the API key.

/tokenize takes a completion's `prompt` or a chat's `messages` (rendered by the chat template, with
the same fields as /v1/chat/completions: tools, add_generation_prompt, continue_final_message,
chat_template_kwargs) and answers {"count", "max_model_len", "tokens", "token_strs"}; /detokenize
takes {"tokens": [...]} and answers {"prompt": text}. Both are tenant work like a request's: the key
is checked before the body is read (guard.py), the body is parsed in the tenant's worker turn,
prompts go through the tokenizer thread in its turn, and token ids are decoded on a worker.
"""
from __future__ import annotations

from importlib.metadata import version as package_version

from fastapi import FastAPI, Request
from pydantic import StrictBool, StrictInt, StrictStr

from ..async_engine.async_llm import AsyncLLM
from ..async_engine.fair_queue import FairQueue
from .body import BodyParser
from .errors import APIError, check_model
from .protocol import MAX_LIST, Capped, ChatTemplateFields, Messages, ProtocolError, _Body
from .tools import chat_messages


class TokenizeBody(ChatTemplateFields):
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Messages | None = None
    add_special_tokens: StrictBool | None = None  # the prompt's are the tokenizer's, a chat's the template's
    return_token_strs: StrictBool = False


class DetokenizeBody(_Body):
    model: StrictStr | None = None
    tokens: Capped(StrictInt, MAX_LIST)


def add_tokenizer_routes(app: FastAPI, llm: AsyncLLM, model_name: str, parser: BodyParser, work: FairQueue) -> None:
    @app.get("/version")
    async def version():
        return {"version": package_version("nano_infer")}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body, prompt = await parser.parse(request, TokenizeBody, lambda body: _tokenize_prompt(body, model_name))
        try:
            tokens = await llm.encode(prompt, request.state.tenant.name)
        except ValueError as e:
            raise APIError(400, str(e), param="messages" if body.messages is not None else "prompt") from e
        strs = await work.run(request.state.tenant.name, _token_strs, llm, tokens) if body.return_token_strs else None
        return {"count": len(tokens), "max_model_len": llm.stats.max_model_len, "tokens": tokens, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        vocab = len(llm.tokenizer)
        _, text = await parser.parse(request, DetokenizeBody, lambda body: _detokenize(body, model_name, llm, vocab))
        return {"prompt": text}


def _tokenize_prompt(body: TokenizeBody, model_name: str) -> str | list[dict]:
    """The prompt to tokenize: the text, or the chat for the template (exactly one of them)."""
    check_model(body.model, model_name)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send a `prompt` (a completion's) or `messages` (a chat's), one of them", param="prompt")
    if body.prompt is not None:
        if body.add_special_tokens is False:
            raise APIError(400, "add_special_tokens: false is not supported (a prompt gets the tokenizer's)",
                           param="add_special_tokens")
        return body.prompt
    if body.add_special_tokens:
        raise APIError(400, "add_special_tokens: true is not supported for messages (the chat template writes "
                            "them)", param="add_special_tokens")
    try:
        return chat_messages(body)
    except ProtocolError as e:
        raise APIError(400, str(e), param=e.param) from e


def _token_strs(llm: AsyncLLM, tokens: list[int]) -> list[str]:
    return llm.tokenizer.convert_ids_to_tokens(tokens)


def _detokenize(body: DetokenizeBody, model_name: str, llm: AsyncLLM, vocab: int) -> str:
    check_model(body.model, model_name)
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"tokens: {bad} is not a token id of this model's tokenizer (0 to {vocab - 1})",
                       param="tokens")
    return llm.tokenizer.decode(body.tokens)
