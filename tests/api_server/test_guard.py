"""The shutdown deadline in the middleware, with routes that reach it at a chosen moment (no engine)."""
import asyncio
import time

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from nano_infer.api_server.guard import Drain, _Guard
from nano_infer.api_server.limits import ServerLimits
from nano_infer.api_server.tenants import Tenants


def guarded_app(drain: Drain) -> Starlette:
    """Each route's response begins once the deadline has passed: its work ended just too late."""
    async def events():
        yield b"data: {}\n\n"
        yield b"data: [DONE]\n\n"

    async def stream(request):
        drain.deadline = time.monotonic() - 1
        return StreamingResponse(events(), media_type="text/event-stream")

    async def reply(request):
        drain.deadline = time.monotonic() - 1
        return JSONResponse({"done": True})

    limits = ServerLimits()
    app = Starlette(routes=[Route("/v1/stream", stream, methods=["POST"]), Route("/v1/reply", reply, methods=["POST"])])
    app.add_middleware(_Guard, allowed_hosts=None, limits=limits, tenants=Tenants((), limits), drain=drain)
    return app


def post(app, path: str) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post(path, json={})
    return asyncio.run(go())


def test_a_stream_that_would_begin_after_the_deadline_is_answered_503():
    r = post(guarded_app(Drain()), "/v1/stream")
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable", r.text


def test_a_reply_ready_after_the_deadline_is_still_sent():
    r = post(guarded_app(Drain()), "/v1/reply")
    assert r.status_code == 200 and r.json() == {"done": True}, r.text
