"""Checks shared by the async-engine and server tests."""


def assert_idle_and_blocks_free(engine) -> None:
    """No request left anywhere, and every block free or held only by the prefix cache."""
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting
    assert not any(engine.kv.ref_count)
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
