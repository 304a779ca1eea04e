"""An OpenAI-compatible HTTP server over AsyncLLM: the API vLLM and SGLang speak too.

    nano-infer serve --port 8000
    client = openai.OpenAI(base_url="http://localhost:8000/v1", api_key="none")
    client.chat.completions.create(model=..., messages=[...], stream=True)

POST /v1/completions and /v1/chat/completions answer with one JSON body, or, with
"stream": true, with server-sent events: one `data: {chunk}` line per new piece of text,
then `data: [DONE]`. GET /v1/models lists the one model, GET /health says whether the
engine thread is alive. Errors carry OpenAI's body, {"error": {"message", "type", "param",
"code"}}, so clients raise their usual exceptions.

One client cannot hurt another's stream: a request is validated strictly (protocol.py) and
refused with 400 before it reaches the engine; bodies over `max_body_bytes` get 413; prompts are
tokenized and constraints compiled off the engine thread, under limits (AsyncLLM); a failure
inside a step fails only its own request. `api_key` requires `Authorization: Bearer <key>` on
/v1/*, and a server bound to localhost answers only requests whose Host header names localhost,
so a web page cannot reach it through DNS rebinding. GET /metrics serves Prometheus metrics.

A client that goes away aborts its request and frees its KV blocks. While streaming,
Starlette notices the disconnect and cancels the response; the cancellation lands in
AsyncLLM.generate, whose cleanup aborts the request. Before the first byte is sent (a
non-streamed reply, or a stream waiting for its first token) `_unless_disconnected`
watches the connection itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
import time
import uuid
from pathlib import Path

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .async_engine import AsyncLLM
from .constrained.compile_pool import CompilePoolBusy
from .detokenizer import is_byte_level, token_bytes_table
from .metrics import EngineMetrics
from .protocol import ChatBody, CompletionBody, ContentPart, ProtocolError, sampling_params
from .outputs import CompletionOutput
from .sampling_params import SamplingParams

log = logging.getLogger("nano_infer.server")
MAX_BODY_BYTES = 4 * 1024**2  # a request body larger than this gets 413 before it is read
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def _sampling_params(body, max_tokens: int | None, logprobs: int | None = None) -> SamplingParams:
    try:
        return sampling_params(body, max_tokens, logprobs)
    except ProtocolError as e:
        raise APIError(400, str(e), param=e.param) from e


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
def public_model_name(llm: AsyncLLM) -> str:
    """What clients call the model: the hub id, or a local folder's name (never its absolute path)."""
    name = llm.engine.config.model
    return Path(llm.engine.model_dir).name if name is None or Path(name).exists() else name


def build_app(llm: AsyncLLM, served_model_name: str | None = None, api_key: str | None = None,
              allowed_hosts: tuple[str, ...] | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app. `allowed_hosts=None` accepts any Host header (a server bound to all interfaces
    behind its own proxy); run_server and BackgroundServer pass LOCAL_HOSTS when bound to localhost."""
    model_name = served_model_name or public_model_name(llm)
    created = int(time.time())
    app = FastAPI(title="nano_infer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(_Guard, allowed_hosts=allowed_hosts, max_body_bytes=max_body_bytes)
    metrics = EngineMetrics(llm.engine, model_name)

    async def authorized(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           "authentication_error", code="invalid_api_key")

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
        if err["type"] == "extra_forbidden":
            return APIError(400, f"unrecognized request argument: {'.'.join(loc)} (this server does not implement it)",
                            param=loc[0]).response()
        return APIError(400, f"{'.'.join(loc)}: {err['msg']}", param=loc[0]).response()

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), kind).response()

    @app.exception_handler(Exception)
    async def _crash(request, exc: Exception):
        error_id = uuid.uuid4().hex[:12]
        log.error("internal error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
        return APIError(500, f"internal server error (id {error_id}, in the server log)", "internal_server_error").response()

    @app.get("/health")
    async def health():
        if not llm.is_running:
            raise APIError(503, "the engine thread has stopped", "service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "nano_infer", "max_model_len": llm.engine.max_model_len}]}

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionBody, request: Request):
        _check_model(body.model, model_name)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: give one prompt per request (got {len(prompt)})", param="prompt")
            prompt = prompt[0]
        if body.echo and body.logprobs is not None:
            raise APIError(400, "echo with logprobs (the prompt's logprobs) is not supported; "
                                "use one or the other", param="echo")
        params = _sampling_params(body, body.max_tokens, body.logprobs)
        return await _generate(llm, request, body, prompt, params, model_name, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(body: ChatBody, request: Request):
        _check_model(body.model, model_name)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        messages = [{"role": m.role, "content": _text_of(m.content)} for m in body.messages]
        params = _sampling_params(body, body.max_completion_tokens or body.max_tokens,
                                  (body.top_logprobs or 0) if body.logprobs else None)
        return await _generate(llm, request, body, messages, params, model_name, chat=True)

    return app


class _Guard:
    """ASGI middleware run before any route: the Host allow-list and the body size limit (413)."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] | None, max_body_bytes: int):
        self.app, self.allowed_hosts, self.max_body_bytes = app, allowed_hosts, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.allowed_hosts is not None and _hostname(headers.get(b"host", b"").decode("latin-1")) not in self.allowed_hosts:
            return await _send_error(send, APIError(400, "this server answers only requests addressed to "
                                                         f"{', '.join(self.allowed_hosts)} (Host header); "
                                                         "start it with --allowed-host to add a name"))
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return await _send_error(send, self._too_large())
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:  # a chunked body that outgrows its limit
                raise HTTPException(413, self._too_large().message)
            return message

        return await self.app(scope, limited_receive, send)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_body_bytes:,} bytes (--max-request-bytes)")


def _hostname(host: str) -> str:
    if host.startswith("["):  # [::1]:8000
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _send_error(send, error: APIError) -> None:
    body = json.dumps({"error": error.body()}).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


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


# -- one request ------------------------------------------------------------------------------
async def _generate(llm: AsyncLLM, request: Request, body, prompt, params: SamplingParams,
                    model_name: str, chat: bool) -> Response:
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    head = {"id": request_id, "created": int(time.time()), "model": model_name}
    outputs = llm.generate(prompt, params, request_id, stream=body.stream)
    render = _Render(llm.tokenizer, chat, params.logprobs, prompt if not chat and getattr(body, "echo", False) else None)
    try:
        if not body.stream:
            return JSONResponse(await _unless_disconnected(request, _whole_reply(outputs, head, render)))
        first = await _unless_disconnected(request, anext(outputs))  # bad input raises here, before the 200
    except ValueError as e:
        raise APIError(400, str(e), param="response_format" if params.constrained and "constraint" in str(e) else None) from e
    except CompilePoolBusy as e:
        raise APIError(503, str(e), "service_unavailable") from e
    except _ClientGone:
        return Response(status_code=499)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    return StreamingResponse(_events(first, outputs, head, render, include_usage), media_type="text/event-stream")


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
    if not work.cancelled() and work.done():
        return work.result()
    with contextlib.suppress(BaseException):  # let the cancellation finish (it aborts the request)
        await work
    raise _ClientGone


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _Render:
    """Outputs as OpenAI choices: a chat message or a completion text, with logprobs when asked
    and the prompt in front of the text with `echo`. Keeps per-sample state across chunks."""

    def __init__(self, tokenizer, chat: bool, logprobs: int | None, echo_prompt):
        self.tokenizer, self.chat, self.logprobs = tokenizer, chat, logprobs
        self.echo = None if echo_prompt is None else (
            echo_prompt if isinstance(echo_prompt, str) else tokenizer.decode(echo_prompt))
        self.started: set[int] = set()
        self.offsets: dict[int, int] = {}  # characters of text sent per sample (completions' text_offset)

    def choice(self, o, final: bool) -> dict:
        """One choice for a CompletionOutput (a delta while streaming, the whole reply when `final`)."""
        first = o.index not in self.started
        self.started.add(o.index)
        text = (self.echo or "") + o.text if first and self.echo is not None else o.text
        logprobs = self._logprobs(o) if self.logprobs is not None else None
        self.offsets[o.index] = self.offsets.get(o.index, 0) + len(text)
        if not self.chat:
            return {"index": o.index, "text": text, "logprobs": logprobs, "finish_reason": o.finish_reason}
        if final:
            message = {"role": "assistant", "content": text}
            return {"index": o.index, "message": message, "logprobs": logprobs, "finish_reason": o.finish_reason}
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": o.index, "delta": delta, "logprobs": logprobs, "finish_reason": o.finish_reason}

    def _token(self, token_id: int) -> tuple[str, bytes]:
        data = self.tokenizer.decode([token_id]).encode() if not is_byte_level(self.tokenizer) else \
            token_bytes_table(self.tokenizer)[0][token_id]
        return data.decode("utf-8", errors="backslashreplace"), data

    def _logprobs(self, o) -> dict:
        entries = list(zip(o.token_ids, o.logprobs or []))
        if self.chat:
            content = []
            for token_id, entry in entries:
                top = sorted(entry.items(), key=lambda kv: kv[1].rank)[: self.logprobs]
                content.append({**self._entry(token_id, entry[token_id].logprob),
                                "top_logprobs": [self._entry(t, lp.logprob) for t, lp in top]})
            return {"content": content}
        offset = self.offsets.get(o.index, 0) + (len(self.echo) if self.echo and o.index not in self.offsets else 0)
        tokens, offsets = [], []
        for token_id, _ in entries:
            tokens.append(self._token(token_id)[0])
            offsets.append(offset)
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [entry[t].logprob for t, entry in entries],
                "top_logprobs": [{self._token(t)[0]: lp.logprob for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)}
                                 for _, entry in entries],
                "text_offset": offsets}

    def _entry(self, token_id: int, logprob: float) -> dict:
        text, data = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(data)}


async def _whole_reply(outputs, head: dict, render: _Render) -> dict:
    merged, prompt_tokens = {}, 0
    async for out in outputs:
        prompt_tokens = len(out.prompt_token_ids)
        for o in out.outputs:
            m = merged.setdefault(o.index, CompletionOutput(o.index, "", [], logprobs=[] if o.logprobs is not None else None))
            m.text += o.text
            m.token_ids += o.token_ids
            m.finish_reason = o.finish_reason
            if o.logprobs is not None:
                m.logprobs += o.logprobs
    choices = [render.choice(merged[i], final=True) for i in sorted(merged)]
    return {**head, "object": "chat.completion" if render.chat else "text_completion", "choices": choices,
            "usage": _usage(prompt_tokens, sum(len(m.token_ids) for m in merged.values()))}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(first, outputs, head: dict, render: _Render, include_usage: bool):
    """The SSE body: a chunk per output with new text (or a finish), then usage, then [DONE]."""
    kind = "chat.completion.chunk" if render.chat else "text_completion"
    completion_tokens, out = 0, first
    try:
        while out is not None:
            choices = []
            for o in out.outputs:
                completion_tokens += len(o.token_ids)
                if not (o.text or o.finish_reason or o.index not in render.started or o.token_ids and render.logprobs is not None):
                    continue  # tokens whose text is still held back (half a character, a possible stop string)
                choices.append(render.choice(o, final=False))
            if choices:
                yield _event({**head, "object": kind, "choices": choices})
            prompt_tokens = len(out.prompt_token_ids)
            out = await anext(outputs, None)
        if include_usage:
            yield _event({**head, "object": kind, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    except Exception as e:  # noqa: BLE001 - the status line is long gone: report in the stream
        error_id = uuid.uuid4().hex[:12]
        log.error("request %s failed while streaming (id %s)", head["id"], error_id, exc_info=e)
        yield _event({"error": APIError(500, f"the request failed (id {error_id}, in the server log)",
                                        "internal_server_error").body()})
    finally:  # closing early (a disconnect) aborts the request
        await outputs.aclose()
    yield "data: [DONE]\n\n"


# -- running it -------------------------------------------------------------------------------
def allowed_hosts_for(host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Bound to localhost: only requests addressed to localhost (and `extra`) are answered, which
    defeats DNS rebinding. Bound to other interfaces: any Host, unless `extra` names some."""
    if host in LOCAL_HOSTS:
        return LOCAL_HOSTS + tuple(extra)
    return tuple(extra) or None


def run_server(llm: AsyncLLM, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
               log_level: str = "info", api_key: str | None = None, allowed_hosts: tuple[str, ...] = (),
               max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Serve until Ctrl-C (blocking)."""
    app = build_app(llm, served_model_name, api_key, allowed_hosts_for(host, allowed_hosts), max_body_bytes)
    uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="off")


class BackgroundServer:
    """uvicorn on a daemon thread with its own event loop, for tests and notebooks.

        server = BackgroundServer(llm)            # port=0: any free port
        openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        server.stop()
    """

    def __init__(self, llm: AsyncLLM, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str | None = None, log_level: str = "warning", api_key: str | None = None,
                 allowed_hosts: tuple[str, ...] = (), max_body_bytes: int = MAX_BODY_BYTES):
        app = build_app(llm, served_model_name, api_key, allowed_hosts_for(host, allowed_hosts), max_body_bytes)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=2)
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
