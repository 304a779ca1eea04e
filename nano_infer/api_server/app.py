"""The FastAPI app: its routes, and how one request becomes an AsyncLLM.generate call and a reply.

A request is checked in full before it reaches the engine, so a bad one costs the engine
nothing: its key and tenant before its body is read (guard.py), the body's fields by pydantic off
the event loop (body.py, protocol.py), then what a field alone cannot say (how many prompts, how
large the reply's logprobs could grow, the model's name) here. The prompts of
one completion request run as engine requests of their own, batched together (fanout.py).

A client that goes away aborts its request and frees its KV blocks. While streaming,
Starlette notices the disconnect and cancels the response; the cancellation lands in
AsyncLLM.generate, whose cleanup aborts the request. Before the first byte is sent (a
non-streamed reply, or a stream waiting for its first token) `unless_disconnected`
watches the connection itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import time
import uuid
from dataclasses import replace

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..async_engine.async_llm import AsyncLLM, EngineUnavailable
from ..beam import BeamSearchParams
from .beam import beam_search_params
from ..constrained.compile_pool import CompilePoolBusy, TenantCompilesBusy
from ..async_engine.fair_queue import FairQueue
from ..async_engine.metrics import EngineMetrics
from .protocol import (ChatBody, CompletionBody, ProtocolError, check_reply_size, completion_prompts,
                        max_prompt_tokens)
from .sampling import sampling_params
from .tools import ToolPlan, chat_messages, tool_plan
from ..sampling_params import SamplingParams
from .body import BodyParser
from .errors import EXCEPTION_HANDLERS, APIError, check_model
from .fanout import fan_out
from .guard import Drain, _Guard
from .limits import ServerLimits
from .render import sse_events, _Render, _whole_reply, whole_reply_bytes
from .responses import ResponsesBody, responses_request
from .responses_render import ResponseReply
from .tenants import Tenants
from .tokenizer_routes import add_tokenizer_routes


SERVER_WORKERS = 2  # threads parsing bodies and rendering whole replies, shared by all tenants in turn
WORK_BACKLOG = 1024  # bodies and reply slices one tenant may have queued (a request queues one at a time)
WORK_DUTY = 0.5  # a tenant keeps a worker busy at most half the time: the engine thread needs the GIL too


def build_app(llm: AsyncLLM, served_model_name: str | None = None, api_key: str | tuple[str, ...] | None = None,
              allowed_hosts: tuple[str, ...] | None = None, limits: ServerLimits = ServerLimits(),
              drain: Drain | None = None, admin_key: str | None = None, metrics_public: bool = False) -> FastAPI:
    """The FastAPI app. `api_key`: one key, or several (a tenant each). `allowed_hosts=None` accepts any
    Host header (a server bound to all interfaces behind its own proxy); run_server and BackgroundServer
    pass LOCAL_HOSTS when bound to localhost, and a Drain they set when the server is told to stop.
    /metrics answers the `admin_key` only, or anyone with `metrics_public`: its counters move with every
    tenant's requests, so reading them beside a victim's request reads the victim's prompt length."""
    model_name = served_model_name or llm.stats.model_name  # `--served-model-name` overrides it, as in vLLM
    app = FastAPI(title="nano_infer", docs_url=None, redoc_url=None, openapi_url=None,
                  exception_handlers=EXCEPTION_HANDLERS)
    keys = (api_key,) if isinstance(api_key, str) else tuple(api_key or ())
    if admin_key is not None and (not admin_key or admin_key in keys):
        raise ValueError("the admin key must be non-empty and differ from every API key (a tenant's key)")
    app.add_middleware(_Guard, allowed_hosts=allowed_hosts, limits=limits,
                       tenants=Tenants(keys, limits), drain=drain or Drain())
    app.state.metrics = EngineMetrics(lambda: llm.stats, model_name)  # errors.py counts the 500s on it
    _add_probes(app, llm, app.state.metrics, None if metrics_public else (admin_key or "").encode())
    work = FairQueue(SERVER_WORKERS, WORK_BACKLOG, "server", duty=WORK_DUTY)  # bodies parsed, replies rendered
    parser = BodyParser(limits, work)
    _add_api(app, llm, model_name, parser, work)
    add_tokenizer_routes(app, llm, model_name, parser, work)
    return app


def _add_probes(app: FastAPI, llm: AsyncLLM, metrics: EngineMetrics, admin_key: bytes | None) -> None:
    """/health, for load balancers, needs no key; /metrics, for Prometheus, the admin key (None: public)."""
    @app.get("/health")
    async def health():
        failure = llm.failure()
        if failure is not None:
            raise APIError(503, f"the engine cannot serve: {failure}", "service_unavailable")
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics(request: Request):
        if admin_key is not None:
            _check_admin(request, admin_key)
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)


def _check_admin(request: Request, admin_key: bytes) -> None:
    """403 on a server with no admin key (saying how to get one), 401 for a missing or wrong one."""
    if not admin_key:
        raise APIError(403, "/metrics is served to the admin key only: start the server with --admin-key (or "
                            "$NANO_INFER_ADMIN_KEY), or with --metrics-public to serve it to anyone", "permission_error")
    given = request.headers.getlist("authorization")
    scheme, _, token = (given[0] if len(given) == 1 else "").encode().partition(b" ")
    if scheme.lower() != b"bearer" or not secrets.compare_digest(token, admin_key):
        raise APIError(401, "/metrics needs the admin key: send 'Authorization: Bearer <admin key>'",
                       "authentication_error", code="invalid_api_key")


def _add_api(app: FastAPI, llm: AsyncLLM, model_name: str, parser: BodyParser, work: FairQueue) -> None:
    """OpenAI's routes: /v1/models, /v1/completions, /v1/chat/completions and /v1/responses (the guard has checked the
    key). A Responses body runs as the chat body it means (responses.py), rendered as a Response."""
    created = int(time.time())

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "nano_infer", "max_model_len": llm.stats.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        max_model_len = llm.stats.max_model_len
        body, (prompts, params) = await parser.parse(
            request, CompletionBody, lambda body: _completion_request(body, model_name, max_model_len))
        return await _generate(llm, work, request, body, prompts, params, model_name, None)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        max_model_len = llm.stats.max_model_len
        body, (messages, params, plan) = await parser.parse(
            request, ChatBody, lambda body: _chat_request(body, model_name, max_model_len))
        return await _generate(llm, work, request, body, [messages], params, model_name, plan)

    @app.post("/v1/responses")
    async def responses(request: Request):
        chat_request = functools.partial(_chat_request, model_name=model_name, max_model_len=llm.stats.max_model_len)
        body, (chat, (messages, params, plan)) = await parser.parse(
            request, ResponsesBody, lambda body: responses_request(body, chat_request))
        return await _generate(llm, work, request, chat, [messages], params, model_name, plan,
                               ResponseReply(body, model_name))


def _completion_request(body: CompletionBody, model_name: str, max_model_len: int) -> tuple[list, SamplingParams]:
    """The prompts (strings or token ids) and the sampling parameters of a /v1/completions body. With
    `echo` and `logprobs` the prompt is scored too (prompt logprobs); `max_tokens: 0` (only with
    `echo`) samples one token from the prompt's last row, which the reply leaves out."""
    check_model(body.model, model_name)
    with _refusal():
        prompts = completion_prompts(body)
        for i, prompt in enumerate(prompts):  # counted here: the engine thread read 2 million ids before refusing them
            if isinstance(prompt, list) and len(prompt) >= max_model_len:
                raise ProtocolError(f"prompt{f' {i}' if len(prompts) > 1 else ''} has {len(prompt):,} tokens; the limit "
                                    f"is max_model_len - 1 = {max_model_len - 1}", param="prompt")
        echoed = [max_prompt_tokens(p, max_model_len) if body.echo else 0 for p in prompts]
        check_reply_size(echoed, body.n, body.max_tokens, body.logprobs, max_model_len)
    max_tokens = 1 if body.max_tokens == 0 else body.max_tokens
    return prompts, sampling_params_from(body, max_tokens, body.logprobs, body.logprobs if body.echo else None)


def _chat_request(body: ChatBody, model_name: str,
                  max_model_len: int) -> tuple[list[dict], SamplingParams, ToolPlan | None]:
    """The messages, for the chat template, the sampling parameters and the tool plan of a /v1/chat/completions body."""
    check_model(body.model, model_name)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    max_tokens, logprobs = body.max_completion_tokens or body.max_tokens, (body.top_logprobs or 0) if body.logprobs else None
    with _refusal():
        messages = chat_messages(body)
        check_reply_size([0], body.n, max_tokens, logprobs, max_model_len)
    return messages, sampling_params_from(body, max_tokens, logprobs), tool_plan(body)


@contextlib.contextmanager
def _refusal():
    """A ProtocolError inside becomes a 400 naming its field."""
    try:
        yield
    except ProtocolError as e:
        raise APIError(400, str(e), param=e.param) from e


def sampling_params_from(body, max_tokens: int | None, logprobs: int | None = None,
                     prompt_logprobs: int | None = None) -> SamplingParams | BeamSearchParams:
    with _refusal():
        make = beam_search_params if body.use_beam_search else sampling_params
        return make(body, max_tokens, logprobs, prompt_logprobs)


def _param_of_engine_error(message: str, params, body) -> str | None:
    """The field an engine ValueError is about: the one that carried the constraint, or `n` (samples or beams
    past max_num_seqs)."""
    if params.constrained and "constraint" in message:
        return next((name for name in CONSTRAINT_CARRIERS if _carries(body, name)), "response_format")
    return "n" if message.startswith(("n=", "beam_width=")) else None


# the body fields a constraint can come from, in the order sampling.py reads them
CONSTRAINT_CARRIERS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                       "guided_grammar", "tool_choice")


def _carries(body, name: str) -> bool:
    value = getattr(body, name, None)
    if name == "response_format":
        return value is not None and getattr(value, "type", "text") != "text"
    if name == "tool_choice":  # "required" or a named function constrains the reply; "auto" and "none" do not
        return bool(getattr(body, "tools", None)) and value is not None and value not in ("auto", "none")
    return value is not None


class _ClientGone(Exception):
    """The client hung up before its reply began: nobody is left to send a response to."""


async def _generate(llm: AsyncLLM, work: FairQueue, request: Request, body, prompts: list, params: SamplingParams,
                    model_name: str, plan: ToolPlan | None, reply: ResponseReply | None = None) -> Response:
    """Run one request (one or more prompts): its whole reply as JSON, or its stream once every
    prompt has its first output. `plan`: a chat's tools (a completion's is None); `reply`: a
    /v1/responses request's, which renders the chat's outputs as a Response."""
    chat = isinstance(body, ChatBody)
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex  # the engine's: never a client's choice
    head = {"id": request_id if body.request_id is None else ("chatcmpl-" if chat else "cmpl-") + body.request_id,
            "created": int(time.time()), "model": model_name}
    echo = not chat and body.echo
    tenant = request.state.tenant
    params = replace(params, cache_salt=tenant.cache_salt(body.cache_salt))
    outputs = fan_out(llm, prompts, params, request_id, stream=body.stream, echo_only=echo and body.max_tokens == 0,
                      tenant=tenant.name, priority=body.priority)
    render = _Render(llm.tokenizer, chat, params.logprobs, echo, plan, body.return_tokens_as_token_ids)
    try:
        if not body.stream:
            collected = await unless_disconnected(request, _whole_reply(outputs))
            content = await (work.run(tenant.name, reply.whole, collected, render) if reply is not None else
                             whole_reply_bytes(collected, head, render, functools.partial(work.run, tenant.name)))
            return Response(content, media_type="application/json")
        first = await unless_disconnected(request, anext(outputs))  # bad input raises here, before the 200
    except ValueError as e:
        raise APIError(400, str(e), param=_param_of_engine_error(str(e), params, body)) from e
    except TenantCompilesBusy as e:
        raise APIError(429, str(e), "rate_limit_error", headers={"Retry-After": "1"}) from e
    except (CompilePoolBusy, EngineUnavailable) as e:
        raise APIError(503, str(e), "service_unavailable") from e
    except _ClientGone:
        return Response(status_code=499)
    options = body.stream_options
    events = reply.events(first, outputs, render) if reply is not None else sse_events(
        first, outputs, head, render, options is not None and options.include_usage,
        options is not None and options.continuous_usage_stats)
    return _ClosingStream(events, media_type="text/event-stream")


class _ClosingStream(StreamingResponse):
    """A stream that closes its events however it ends (a client cut off, a task cancelled at the shutdown
    deadline), so its requests are aborted there and then, not by asyncio's clean-up of abandoned
    generators as the loop closes, where a second Ctrl-C or SIGTERM could interrupt them."""

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def unless_disconnected(request: Request, awaitable):
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
