"""An OpenAI-compatible HTTP server over AsyncLLM: the API vLLM and SGLang speak too.

    nano-infer serve --port 8000
    client = openai.OpenAI(base_url="http://localhost:8000/v1", api_key="none")
    client.chat.completions.create(model=..., messages=[...], stream=True)

POST /v1/completions and /v1/chat/completions answer with one JSON body, or, with
"stream": true, with server-sent events: one `data: {chunk}` line per new piece of text,
then `data: [DONE]`. GET /v1/models lists the one model, GET /health says whether the
engine thread is alive, and vLLM's /tokenize, /detokenize and /version answer too. Errors carry
OpenAI's body, {"error": {"message", "type", "param", "code"}}, so clients raise their usual exceptions.

One client (tenant: an API key, else an address) cannot hurt another's stream: connections,
bodies and requests in flight are bounded per client (ServerLimits); a request is validated
strictly off the event loop (body.py, protocol.py) and refused with 400 before it reaches the
engine; prompts are tokenized and constraints compiled off the engine thread, under limits, and
tenants are admitted to the engine in turn (AsyncLLM); a failure inside a step fails only its own
request. `api_key` (one or several) requires `Authorization: Bearer <key>` on /v1/*, and a server
bound to localhost answers only requests whose Host header names localhost, so a web page cannot
reach it through DNS rebinding. GET /metrics serves Prometheus metrics.

The pieces (a request meets the first five in this order):

    connections.py  uvicorn's h11 protocol with connection caps and a deadline for a request to arrive
    guard.py    ASGI middleware before any route: Host, framing, API key, tenant, body size, slow readers
    tenants.py  who a request is from, and that tenant's requests in flight (429 past the cap)
    body.py     the body parsed and validated on a thread, a tenant's bodies one at a time
    app.py      the routes, and how one request becomes AsyncLLM.generate calls and a response
    beam.py     a request for beam search (`use_beam_search`) as BeamSearchParams
    fanout.py   the prompts of one request queued together, their outputs merged into one stream
    render.py   engine outputs as OpenAI bodies: a whole reply, or server-sent events
    tokenizer_routes.py  vLLM's /tokenize, /detokenize and /version
    errors.py   APIError, and every other failure turned into OpenAI's error body
    runner.py   uvicorn around the app: blocking (`nano-infer serve`) or on a thread; stops on a dead engine
    limits.py   ServerLimits: every bound above, with its default
"""
from .app import build_app
from .errors import APIError
from .guard import LOCAL_HOSTS, allowed_hosts_for
from .limits import MAX_BODY_BYTES, ServerLimits
from .runner import BackgroundServer, run_server

__all__ = ["APIError", "BackgroundServer", "LOCAL_HOSTS", "MAX_BODY_BYTES", "ServerLimits", "allowed_hosts_for", "build_app",
           "run_server"]
