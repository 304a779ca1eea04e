"""Checks shared by the async-engine and server tests."""
import contextlib
import socket
import time

import httpx
import pytest

ADMIN_KEY = "admin-key"  # what `serving` gives its server for /metrics
START_S = 180  # import torch, load the model, start uvicorn: a bound for a slow machine, not a speed check


def assert_idle_and_blocks_free(engine) -> None:
    """No request left anywhere, and every block free or held only by the prefix cache."""
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting
    assert all(r == engine.kv.holds(b) for b, r in enumerate(engine.kv.ref_count))  # the cache's reference only
    assert engine.kv.num_free_blocks + engine.prefix_cache.num_evictable_blocks() == engine.kv.num_blocks


def record_aborts(monkeypatch, engine) -> list:
    """Wrap engine.abort_request so a test can see which requests were aborted."""
    aborted = []
    abort = engine.abort_request

    def recording(request_id):
        out = abort(request_id)
        aborted.append(out)
        return out

    monkeypatch.setattr(engine, "abort_request", recording)
    return aborted


@contextlib.contextmanager
def serving(model_dir, **options):
    """An AsyncLLM on `model_dir` behind a BackgroundServer on a free port; both stopped after."""
    from nano_infer.async_engine.async_llm import AsyncLLM
    from nano_infer.api_server import BackgroundServer

    llm = AsyncLLM(str(model_dir), dtype="float32", block_size=4, **options)
    server = BackgroundServer(llm, admin_key=ADMIN_KEY)
    try:
        yield llm, server
    finally:
        server.stop()
        llm.shutdown()


def metrics_text(url: str, admin_key: str = ADMIN_KEY) -> str:
    """GET /metrics as the server's admin."""
    reply = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {admin_key}"})
    assert reply.status_code == 200, reply.text
    return reply.text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(proc, url: str) -> None:
    """Poll /health until a server subprocess answers; fail with its stderr if it exits or takes over START_S."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the server did not answer /health within {START_S} s: {proc.communicate()[1]}")
