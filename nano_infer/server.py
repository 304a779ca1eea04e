"""An OpenAI-compatible HTTP server over AsyncLLM: the API vLLM and SGLang speak too.

    nano-infer serve --port 8000
    client = openai.OpenAI(base_url="http://localhost:8000/v1", api_key="none")
    client.chat.completions.create(model=..., messages=[...], stream=True)

POST /v1/completions and /v1/chat/completions answer with one JSON body, or, with
"stream": true, with server-sent events: one `data: {chunk}` line per new piece of text,
then `data: [DONE]`. GET /v1/models lists the one model, GET /health says whether the
engine thread is alive. Errors carry OpenAI's body, {"error": {"message", "type", "param",
"code"}}, so clients raise their usual exceptions.

A client that goes away aborts its request and frees its KV blocks. While streaming,
Starlette notices the disconnect and cancels the response; the cancellation lands in
AsyncLLM.generate, whose cleanup aborts the request. Before the first byte is sent (a
non-streamed reply, or a stream waiting for its first token) `_unless_disconnected`
watches the connection itself.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from .async_engine import AsyncLLM
from .sampling_params import SamplingParams


# -- the request bodies (the fields nano_infer acts on; others are accepted and ignored) -------
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    name: str | None = None
    schema_: dict = Field(alias="schema")


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _GenerateBody(_Body):
    model: str | None = None  # None: the served model
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    top_k: int = -1  # vLLM's extras (the openai client sends them with extra_body=...)
    ignore_eos: bool = False


class CompletionBody(_GenerateBody):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions


class ContentPart(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: str
    content: str | list[ContentPart]


class ChatBody(_GenerateBody):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name for max_tokens


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.body()}, status_code=self.status)

    def body(self) -> dict:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class _ClientGone(Exception):
    pass


# -- the app ----------------------------------------------------------------------------------
def build_app(llm: AsyncLLM, served_model_name: str | None = None) -> FastAPI:
    model_name = served_model_name or llm.model_name
    created = int(time.time())
    app = FastAPI(title="nano_infer", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        err = exc.errors()[0]
        if err["type"] == "json_invalid":
            detail = err.get("ctx", {}).get("error", err["msg"])
            return APIError(400, f"the request body is not valid JSON ({detail})").response()
        loc = [str(x) for x in err["loc"][1:]]  # drop "body"
        if not loc:
            return APIError(400, f"the request body must be a JSON object, sent with Content-Type: application/json "
                                 f"({err['msg']})").response()
        return APIError(400, f"{'.'.join(loc)}: {err['msg']}", param=loc[0]).response()

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), kind).response()

    @app.exception_handler(Exception)
    async def _crash(request, exc: Exception):
        return APIError(500, f"{type(exc).__name__}: {exc}", "internal_server_error").response()

    @app.get("/health")
    async def health():
        if not llm.is_running:
            raise APIError(503, "the engine thread has stopped", "service_unavailable")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "nano_infer", "max_model_len": llm.engine.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        _check_model(body.model, model_name)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: give one prompt per request (got {len(prompt)})", param="prompt")
            prompt = prompt[0]
        params = _sampling_params(body, body.max_tokens)
        return await _generate(llm, request, body, prompt, params, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        _check_model(body.model, model_name)
        messages = [{"role": m.role, "content": _text_of(m.content)} for m in body.messages]
        params = _sampling_params(body, body.max_completion_tokens or body.max_tokens)
        return await _generate(llm, request, body, messages, params, model_name, chat=True)

    return app


def _check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise APIError(404, f"The model `{requested}` does not exist. This server serves `{served}`.",
                       param="model", code="model_not_found")


def _text_of(content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    if any(part.type != "text" or part.text is None for part in content):
        raise APIError(400, "messages: only text content parts are supported", param="messages")
    return "\n".join(part.text for part in content)


def _sampling_params(body: _GenerateBody, max_tokens: int | None) -> SamplingParams:
    schema = None
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "response_format: type 'json_schema' needs a 'json_schema': {'schema': {...}}",
                           param="response_format")
        schema = fmt.json_schema.schema_
    elif fmt is not None and fmt.type == "json_object":
        schema = {"type": "object"}
    try:
        return SamplingParams(n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                              max_tokens=max_tokens, stop=body.stop, seed=body.seed, ignore_eos=body.ignore_eos,
                              json_schema=schema)
    except ValueError as e:
        raise APIError(400, str(e)) from e


# -- one request ------------------------------------------------------------------------------
async def _generate(llm: AsyncLLM, request: Request, body: _GenerateBody, prompt, params: SamplingParams,
                    model_name: str, chat: bool) -> Response:
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    head = {"id": request_id, "created": int(time.time()), "model": model_name}
    outputs = llm.generate(prompt, params, request_id, stream=body.stream)
    try:
        if not body.stream:
            return JSONResponse(await _unless_disconnected(request, _whole_reply(outputs, head, chat)))
        first = await _unless_disconnected(request, anext(outputs))  # bad input raises here, before the 200
    except ValueError as e:
        raise APIError(400, str(e)) from e
    except _ClientGone:
        return Response(status_code=499)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return StreamingResponse(_events(first, outputs, head, chat, include_usage), media_type="text/event-stream")


async def _unless_disconnected(request: Request, awaitable):
    """Await `awaitable`, cancelling it (and so aborting its request) if the client leaves first."""
    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.ensure_future(awaitable), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if work.cancelled():
        raise _ClientGone
    return work.result()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def _whole_reply(outputs, head: dict, chat: bool) -> dict:
    texts, reasons, prompt_tokens, completion_tokens = {}, {}, 0, 0
    async for out in outputs:
        prompt_tokens = len(out.prompt_token_ids)
        for o in out.outputs:
            texts[o.index] = texts.get(o.index, "") + o.text
            reasons[o.index] = o.finish_reason
            completion_tokens += len(o.token_ids)
    if chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": texts[i]}, "logprobs": None,
                    "finish_reason": reasons[i]} for i in sorted(texts)]
    else:
        choices = [{"index": i, "text": texts[i], "logprobs": None, "finish_reason": reasons[i]} for i in sorted(texts)]
    return {**head, "object": "chat.completion" if chat else "text_completion", "choices": choices,
            "usage": _usage(prompt_tokens, completion_tokens)}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(first, outputs, head: dict, chat: bool, include_usage: bool):
    """The SSE body: a chunk per output with new text (or a finish), then usage, then [DONE]."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    started: set[int] = set()
    completion_tokens, out = 0, first
    try:
        while out is not None:
            choices = []
            for o in out.outputs:
                completion_tokens += len(o.token_ids)
                if not (o.text or o.finish_reason or o.index not in started):
                    continue  # tokens whose text is still held back (half a character, a possible stop string)
                if chat:
                    delta = {"role": "assistant", "content": o.text} if o.index not in started else (
                        {"content": o.text} if o.text else {})
                    choices.append({"index": o.index, "delta": delta, "logprobs": None, "finish_reason": o.finish_reason})
                else:
                    choices.append({"index": o.index, "text": o.text, "logprobs": None, "finish_reason": o.finish_reason})
                started.add(o.index)
            if choices:
                yield _event({**head, "object": kind, "choices": choices})
            prompt_tokens = len(out.prompt_token_ids)
            out = await anext(outputs, None)
        if include_usage:
            yield _event({**head, "object": kind, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    except Exception as e:  # noqa: BLE001 - the status line is long gone: report in the stream
        yield _event({"error": APIError(500, f"{type(e).__name__}: {e}", "internal_server_error").body()})
    finally:  # closing early (a disconnect) aborts the request
        await outputs.aclose()
    yield "data: [DONE]\n\n"


# -- running it -------------------------------------------------------------------------------
def run_server(llm: AsyncLLM, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
               log_level: str = "info") -> None:
    """Serve until Ctrl-C (blocking)."""
    uvicorn.run(build_app(llm, served_model_name), host=host, port=port, log_level=log_level, lifespan="off")


class BackgroundServer:
    """uvicorn on a daemon thread with its own event loop, for tests and notebooks.

        server = BackgroundServer(llm)            # port=0: any free port
        openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        server.stop()
    """

    def __init__(self, llm: AsyncLLM, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str | None = None, log_level: str = "warning"):
        config = uvicorn.Config(build_app(llm, served_model_name), host=host, port=port, log_level=log_level,
                                lifespan="off", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="nano_infer-server", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server did not start on {host}:{port} (see the log above)")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
