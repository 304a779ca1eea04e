"""The clients the attack tests run: a victim tenant streaming beside an attacker, floods, and the server they share.

A slowdown is measured as the victim's time to its first token (or its worst gap between two chunks)
under an attack against the same measure under a control load, in the same run: never a wall-clock figure.
"""
import collections
import contextlib
import json
import threading
import time

import httpx

from nano_infer.api_server import BackgroundServer, ServerLimits
from nano_infer.constrained import ConstraintLimits
from tests.helpers.engine_checks import ADMIN_KEY, assert_idle_and_blocks_free, metrics_text

VICTIM_TOKENS = 48
MAX_GAP = 2.0  # seconds between two chunks of a victim's stream, or before its first
COMPILE_TIMEOUT = 3.0


class Victims:
    """Streams chat completions back to back on a thread, recording when each chunk arrives."""

    def __init__(self, url: str, key: str | None = None):
        self.url, self.stop, self.streams, self.errors = url, threading.Event(), [], []
        self.headers = {"authorization": f"Bearer {key}"} if key else {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        body = {"messages": [{"role": "user", "content": "To be, or not to be?"}], "max_tokens": VICTIM_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.Client(timeout=60, headers=self.headers) as client:
            while not self.stop.is_set():
                times, usage, finish = [time.monotonic()], None, None
                self.streams.append(times)  # filled in as chunks arrive
                try:
                    with client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                        for line in r.iter_lines():
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            times.append(time.monotonic())
                            chunk = json.loads(line[6:])
                            if "error" in chunk:
                                raise RuntimeError(chunk["error"])
                            usage = chunk.get("usage") or usage
                            finish = next((c["finish_reason"] for c in chunk["choices"] if c["finish_reason"]), finish)
                    if r.status_code != 200 or usage is None or usage["completion_tokens"] != VICTIM_TOKENS or finish != "length":
                        raise RuntimeError(f"victim stream ended short: {r.status_code} {usage} {finish}")
                except Exception as e:  # noqa: BLE001 - recorded, asserted on by the test
                    self.errors.append(repr(e))

    def next_chunk_after(self, moment: float, timeout: float = 60.0) -> float:
        """Wait for a victim chunk later than `moment`, so a wait that spans it is measured whole."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.streams and self.streams[-1][-1] > moment:
                return moment
            time.sleep(0.02)
        return moment

    def worst_gap(self, start: float, end: float) -> float:
        """The longest wait for a chunk (or a first chunk) that overlaps [start, end]."""
        gaps = [b - a for times in self.streams for a, b in zip(times, times[1:]) if b >= start and a <= end]
        return max(gaps, default=float("inf"))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def post(url, path, body=None, content=None, timeout=30.0, headers=None):
    return httpx.post(url + path, json=body, content=content, timeout=timeout, headers=headers)


CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}


def encoded(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def chat(**extra):
    return {**CHAT, **extra}



VICTIM, ATTACKER = "victim-key", "attacker-key"
ROUND2_LIMITS = ServerLimits(request_timeout=1.5, max_connections_per_peer=32, max_requests_per_tenant=24,
                             max_queued_per_tenant=3, body_bytes_per_s=8 * 1024**2, send_timeout=3, shutdown_timeout=2)

def as_attacker(url, path, body=None, key=ATTACKER, **kw):
    return post(url, path, body, headers={"authorization": f"Bearer {key}", **kw.pop("headers", {})}, **kw)


def beside_victims(url, attack):
    """Run `attack()` while the victim tenant streams; the victims must finish whole, no gap over MAX_GAP."""
    with Victims(url, VICTIM) as victims:
        while not victims.streams or len(victims.streams[0]) < 3:
            time.sleep(0.02)
        start = time.monotonic()
        result = attack()
        gap = victims.worst_gap(start, victims.next_chunk_after(time.monotonic()))
    assert not victims.errors, victims.errors[:3]
    assert gap < MAX_GAP, gap
    return result


def settle(llm):
    deadline = time.monotonic() + 20
    while llm.engine.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert_idle_and_blocks_free(llm.engine)



def victim_first_tokens(url, count=3) -> float:
    """The slowest of `count` first tokens of the victim tenant's streams, one after another."""
    body = {**chat(max_tokens=4, ignore_eos=True), "stream": True}
    worst = 0.0
    with httpx.Client(timeout=120, headers={"authorization": f"Bearer {VICTIM}"}) as client:
        for _ in range(count):
            start = time.monotonic()
            with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200, r.read()
                next(line for line in r.iter_lines() if line.startswith("data: "))
            worst = max(worst, time.monotonic() - start)
    return worst


class Flood:
    """`loops` threads posting `body` (bytes) as the attacker, back to back, until the block ends."""

    def __init__(self, url, path, body: bytes, loops: int):
        self.stop, self.statuses = threading.Event(), collections.Counter()
        self.threads = [threading.Thread(target=self._loop, args=(url, path, body), daemon=True) for _ in range(loops)]

    def _loop(self, url, path, body):
        with httpx.Client(timeout=120, headers={"authorization": f"Bearer {ATTACKER}",
                                                "content-type": "application/json"}) as client:
            while not self.stop.is_set():
                self.statuses[client.post(url + path, content=body).status_code] += 1

    def __enter__(self):
        self.start = time.monotonic()
        for t in self.threads:
            t.start()
        time.sleep(1.0)  # the backlog builds up
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(120)
        self.seconds = time.monotonic() - self.start



def metric(url, name) -> float:
    text = metrics_text(url)
    return float(next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(f"nano_infer_{name}{{")))


@contextlib.contextmanager
def two_tenants(model_dir, limits: ServerLimits = ROUND2_LIMITS, **options):
    """A server with two API keys (VICTIM's and ATTACKER's tenants) and ADMIN_KEY for /metrics, 16 sequences per
    step, small connection limits; `options` go to the AsyncLLM."""
    from nano_infer.async_engine.async_llm import AsyncLLM

    options = {"dtype": "float32", "block_size": 4, "max_num_seqs": 16,
               "constraint_limits": ConstraintLimits(timeout=COMPILE_TIMEOUT), **options}
    llm = AsyncLLM(str(model_dir), **options)
    server = BackgroundServer(llm, api_key=(VICTIM, ATTACKER), limits=limits, admin_key=ADMIN_KEY)
    try:
        yield llm, server
    finally:
        server.stop()
        llm.shutdown()
