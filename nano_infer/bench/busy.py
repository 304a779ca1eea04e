"""Other work on the cores while an engine decodes: `python -m nano_infer.bench.llamacpp --busy N`.

A reader's laptop runs a browser and often a second notebook kernel beside the one that chats, and an engine whose
threads wait on each other slows more there than its quiet figure says. The comparison with llama.cpp therefore
times each engine quiet and busy, in the same round, and compares how much each one slowed. The load is N
processes of one kind:

- "spin": a Python loop that keeps one core busy, the plainest load there is;
- "decode": a second nano_infer engine on the same file, decoding one chat after another (a server or a second
  kernel next to the notebook), which also competes for memory bandwidth.

The processes start once and are paused (SIGSTOP) whenever no busy run is timed, so a decode load loads its model
once, and a quiet run shares the cores with nothing. Linux and macOS (POSIX signals).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

KINDS = ("spin", "decode")
READY = "@@busy-ready"


class BusyLoad:
    """`n` paused processes of `kind` (for "decode", engines on `model`), resumed inside `with load:` only."""

    def __init__(self, n: int, kind: str = "spin", model: str | None = None):
        if kind not in KINDS:
            raise ValueError(f"busy kind {kind!r} is unknown: use one of {', '.join(KINDS)}")
        if n < 0:
            raise ValueError(f"the number of busy processes must be at least 0, got {n}")
        if kind == "decode" and model is None:
            raise ValueError("a decode load needs the model file it decodes")
        self.n, self.kind = n, kind
        command = [sys.executable, "-m", "nano_infer.bench.busy", kind, str(model)]
        self.procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(n)]
        try:
            for p in self.procs:  # a decode load has loaded its model and decoded once
                if p.stdout.readline().strip() != READY:
                    raise RuntimeError(f"a busy {kind} process exited (code {p.wait()}); its stderr says why")
            self._pause()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> BusyLoad:
        for p in self.procs:
            os.kill(p.pid, signal.SIGCONT)
        return self

    def __exit__(self, *exc) -> None:
        self._pause()

    def _pause(self) -> None:
        """Stop every process and wait until each has stopped (a signal is delivered, not obeyed, by kill)."""
        for p in self.procs:
            os.kill(p.pid, signal.SIGSTOP)
        for p in self.procs:
            os.waitpid(p.pid, os.WUNTRACED)

    def describe(self) -> str:
        what = "spinning Python loop" if self.kind == "spin" else "nano_infer engine decoding"
        return f"{self.n} {what}" if self.n == 1 else f"{self.n} {what.replace('loop', 'loops').replace('engine ', 'engines ')}"

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # SIGKILL ends a stopped process too
            p.wait()


def _spin() -> None:
    print(READY, flush=True)
    while True:
        pass


def _decode(model: str) -> None:
    """A user's second engine: the defaults it starts with (threads included), one chat after another."""
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    llm = LLM(model)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    prompt = "Tell me about the sea, the ships on it and the people who sail them."
    llm.generate([prompt], params, use_tqdm=False)
    print(READY, flush=True)
    while True:
        llm.generate([prompt], params, use_tqdm=False)


if __name__ == "__main__":
    _spin() if sys.argv[1] == "spin" else _decode(sys.argv[2])
