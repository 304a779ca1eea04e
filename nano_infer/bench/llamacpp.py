"""One chat against llama.cpp on the same GGUF file: `python -m nano_infer.bench.llamacpp`.

A learner who wants to chat with a small model on a laptop reaches for llama.cpp, so that is the
engine to compare with at one sequence: the same file, the same prompt token ids, greedy, the
same number of output tokens (neither stops at an end-of-turn token) and the same number of
threads. Each engine runs in its own worker process, loaded and warmed up once; the rounds
alternate between them while the other one waits on its stdin, so neither shares the cores
with the other, and the order flips each round. Every round has a new conversation, so
neither engine's prefix cache serves a prompt it has seen.

Beside the times it prints the floor both engines stand on: a decode step at one sequence
reads every weight once, so it cannot take less than the weights' bytes over the memory
bandwidth (`decode.copy_bandwidth`, measured in the same run; it counts the read and the write
of a copy, the rate a stream of reads gets). The floor is given for the file's tensors as
stored and for the same weights dequantized to bfloat16.

    python -m nano_infer.bench.llamacpp                           # make models, make llama-cpp first
    python -m nano_infer.bench.llamacpp --rounds 5 --threads 2 --max-tokens 128
    python -m nano_infer.bench.llamacpp --quantization none     # nano_infer dequantizing the file at load
    python -m nano_infer.bench.llamacpp --shape 0.5b            # Qwen2.5-0.5B's shape (bench/shaped_gguf.py)
    python -m nano_infer.bench.llamacpp --busy 2                # also beside two busy processes (bench/busy.py)
    python -m nano_infer.bench.llamacpp --busy 1 --busy-kind decode   # ... beside a second nano_infer decoding

`python -m nano_infer.bench` runs it too (`--no-llama-cpp` leaves it out).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .busy import KINDS
from .timing import verdict

DEFAULT_GGUF = Path(__file__).resolve().parents[2] / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # make models
ENGINES = ("nano_infer", "llama.cpp")
RESULT = "@@result "  # a worker's result lines start with this: the engines print their own lines too
SYSTEM = ("Chat {round}. You are a patient assistant who explains things to a curious reader in plain "
          "words, with one concrete example, and never more than a few short paragraphs.")
QUESTION = ("I keep reading that generating text with a language model is limited by memory bandwidth rather "
            "than by arithmetic. What does that mean, and why would a smaller file make it faster?")


def missing() -> str | None:
    """Why the comparison cannot run here, in words, or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama.cpp comparison skipped: llama-cpp-python is not installed "
                "(`make llama-cpp` builds it from PyPI, about 4 minutes on 2 cores)")
    return None


def chat(round: int) -> list[dict]:
    """The conversation of one round: a new first line each round, so no prefix cache can serve it."""
    return [{"role": "system", "content": SYSTEM.format(round=round)}, {"role": "user", "content": QUESTION}]


@dataclass
class ChatTiming:
    """One engine's run of one chat: time to the first token and the mean time per token after it."""

    engine: str
    prompt_tokens: int
    ttft_ms: float
    ms_per_token: float
    token_ids: list[int]

    @staticmethod
    def from_times(engine: str, prompt_tokens: int, start: float, times: list[float], token_ids: list[int]) -> ChatTiming:
        if len(times) < 2:
            raise ValueError(f"{engine}: {len(times)} token(s) timed; a decode time needs at least 2")
        return ChatTiming(engine, prompt_tokens, 1e3 * (times[0] - start),
                          1e3 * (times[-1] - times[0]) / (len(times) - 1), list(token_ids))


def paired_ratios(ours: list[float], theirs: list[float]) -> dict:
    """nano_infer / llama.cpp per round (below 1: nano_infer takes less time); median and spread, and a verdict
    that is "inconclusive" when the rounds fall on both sides of 1."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"paired rounds needed: {len(ours)} nano_infer and {len(theirs)} llama.cpp times")
    per_round = [a / b for a, b in zip(ours, theirs)]
    return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round),
            "per_round": per_round, "verdict": verdict(per_round, 1.0, "llama.cpp faster", "nano_infer faster")}


def gguf_weight_bytes(path: str | Path) -> dict:
    """Bytes of the file's tensors as stored, their element count, and what bfloat16 copies would take."""
    from ..models.gguf import read_gguf_tensors

    tensors = read_gguf_tensors(Path(path))
    stored = sum(t.data.nbytes for t in tensors)
    elements = sum(math.prod(t.shape) for t in tensors)
    return {"tensors": len(tensors), "stored_bytes": stored, "elements": elements, "bfloat16_bytes": 2 * elements}


def roofline(weights: dict, bandwidth: float) -> dict:
    """The least ms per token a decode step at one sequence can take: every weight read once, at `bandwidth`."""
    return {"bandwidth_bytes_per_s": bandwidth, "stored_ms": 1e3 * weights["stored_bytes"] / bandwidth,
            "bfloat16_ms": 1e3 * weights["bfloat16_bytes"] / bandwidth}


# -- the workers: one engine each, driven over stdin/stdout ----------------------------------------------------


def _nano_worker(model: str, threads: int, quantization: str | None = None):
    import torch
    from transformers.utils import logging as hf_logging

    from ..engine.llm_engine import LLMEngine
    from ..sampling_params import SamplingParams
    from ..text.chat_template import chat_token_ids

    hf_logging.disable_progress_bar()  # transformers' bar while it reads the GGUF file
    torch.set_num_threads(threads)
    before_load = rss_mib()
    engine = LLMEngine(model, **({"quantization": quantization} if quantization else {}))  # else what a user gets

    def encode(messages):
        return chat_token_ids(engine.tokenizer, messages)

    def run(ids: list[int], max_tokens: int) -> ChatTiming:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        engine.add_request(f"chat-{start}", prompt_token_ids=ids, params=params, arrival_time=start)
        out = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                out = o if o.finished else out
        return ChatTiming.from_times("nano_infer", len(ids), start, out.metrics.token_times,
                                     out.outputs[0].token_ids)

    return encode, run, before_load


def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_int8" in f.read()
    except OSError:
        return False


def _llama_cpp_worker(model: str, threads: int):
    import llama_cpp.llama_cpp as low_level
    from llama_cpp import Llama

    if _cpu_has_amx():
        # llama-cpp-python 0.3.36 built here (-march=native) segfaults in its AMX buffer type on any batch of
        # more than one token (a prompt); without the extra buffer types (AMX, repacked layouts) it runs.
        # Llama() takes its model parameters from this function and has no keyword for the field.
        defaults = low_level.llama_model_default_params

        def without_extra_buffer_types():
            params = defaults()
            params.use_extra_bufts = False
            return params

        low_level.llama_model_default_params = without_extra_buffer_types
    before_load = rss_mib()
    llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, seed=0, verbose=False)

    def run(ids: list[int], max_tokens: int) -> ChatTiming:
        llm.reset()  # forget the last chat: no prompt tokens served from its cache
        start, times, tokens = time.perf_counter(), [], []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):  # greedy; generate() never stops by itself
            times.append(time.perf_counter())
            tokens.append(token)
            if len(tokens) == max_tokens:
                break
        return ChatTiming.from_times("llama.cpp", len(ids), start, times, tokens)

    return None, run, before_load


def rss_mib() -> float | None:
    """The process's resident memory now (Linux's /proc; None elsewhere): what stays, where the peak is
    `ru_maxrss`."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return None


def worker(engine: str, model: str, threads: int, quantization: str | None = None) -> None:
    """Load one engine, say so, then run each chat read from stdin ({"ids", "max_tokens"} or {"messages"})."""
    if engine == "nano_infer":
        encode, run, before_load = _nano_worker(model, threads, quantization)
    else:
        encode, run, before_load = _llama_cpp_worker(model, threads)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ready = {"ready": engine, "max_rss_mib": peak_kib / 1024, "before_load_rss_mib": before_load}
    if engine == "llama.cpp":
        ready["extra_buffer_types"] = not _cpu_has_amx()
    print(RESULT + json.dumps(ready), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if "messages" in job:
            reply = {"ids": encode(job["messages"])}
        else:
            reply = asdict(run(job["ids"], job["max_tokens"]))
            reply["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            reply["rss_mib"] = rss_mib()
        print(RESULT + json.dumps(reply), flush=True)


class Worker:
    """A worker process of one engine, and the calls that talk to it."""

    def __init__(self, engine: str, model: str, threads: int, quantization: str | None = None):
        self.engine = engine
        extra = ["--quantization", quantization] if quantization else []
        self.proc = subprocess.Popen([sys.executable, "-m", "nano_infer.bench.llamacpp", "--worker", engine,
                                      "--model", str(model), "--threads", str(threads), *extra],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
        raise RuntimeError(f"the {self.engine} worker exited (code {self.proc.wait()}); its stderr says why")

    def ask(self, job: dict) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        """End of input ends the worker's loop; one that already died (its error is being raised) is just reaped."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait(timeout=60)


def compare(model: str | Path = DEFAULT_GGUF, rounds: int = 3, threads: int = 2, max_tokens: int = 128,
            quantization: str | None = None, busy: int = 0, busy_kind: str = "spin", log=print) -> dict:
    """Both engines on one chat per round, alternating; the times, their ratios and the roofline. JSON-ready.
    `quantization` is nano_infer's option (None: its default). With `busy` > 0, each engine also runs each round's
    chat beside `busy` processes of `busy_kind` (bench/busy.py), right after its quiet run."""
    import torch

    from .busy import BusyLoad
    from .decode import copy_bandwidth

    if rounds < 1 or max_tokens < 2:
        raise ValueError(f"rounds must be at least 1 and max_tokens at least 2, got {rounds} and {max_tokens}")
    workers, load = {}, None
    try:
        load = BusyLoad(busy, busy_kind, str(model)) if busy else None
        for name in ENGINES:
            workers[name] = Worker(name, str(model), threads, quantization if name == "nano_infer" else None)
        # round 0 warms up; a busy run gets a conversation of its own, so no prefix cache serves it from the quiet one
        prompts = [workers["nano_infer"].ask({"messages": chat(r)})["ids"] for r in range(rounds + 1 + rounds * bool(load))]
        grown = {}
        for name, w in workers.items():  # round 0 warms both up (first calls allocate and initialise)
            now = w.ask({"ids": prompts[0], "max_tokens": 8})["rss_mib"]
            before = w.ready["before_load_rss_mib"]
            grown[name] = None if now is None or before is None else now - before
        runs, busy_runs = {name: [] for name in ENGINES}, {name: [] for name in ENGINES}
        for r in range(1, rounds + 1):
            for name in ENGINES if r % 2 else ENGINES[::-1]:
                job = {"ids": prompts[r], "max_tokens": max_tokens}
                runs[name].append(workers[name].ask(job))
                t = runs[name][-1]
                log(f"  round {r}/{rounds} {name:>10}: {t['ms_per_token']:6.1f} ms/token, TTFT {t['ttft_ms']:6.0f} ms")
                if load:
                    with load:
                        busy_runs[name].append(b := workers[name].ask(dict(job, ids=prompts[rounds + r])))
                    log(f"  {'':>9} busy {name:>10}: {b['ms_per_token']:6.1f} ms/token, TTFT {b['ttft_ms']:6.0f} ms")
        memory = {name: max([w.ready["max_rss_mib"]] + [t["max_rss_mib"] for t in runs[name]])
                  for name, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
        if load:
            load.close()
    with_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    bandwidth = copy_bandwidth(torch.device("cpu"))  # the workers are idle now
    torch.set_num_threads(with_threads)
    same = [leading_agreement(a["token_ids"], b["token_ids"]) for a, b in zip(runs["nano_infer"], runs["llama.cpp"])]
    weights = gguf_weight_bytes(model)
    result = {
        "model": str(model), "rounds": rounds, "threads": threads, "max_tokens": max_tokens,
        "nano_infer_quantization": quantization or "default",
        "prompt_tokens": [len(p) for p in prompts[1:]], "runs": runs, "peak_rss_mib": memory,
        "grown_rss_mib": grown,
        "median": {name: {k: statistics.median(t[k] for t in rows) for k in ("ms_per_token", "ttft_ms")}
                   for name, rows in runs.items()},
        "ratios": {k: paired_ratios([t[k] for t in runs["nano_infer"]], [t[k] for t in runs["llama.cpp"]])
                   for k in ("ms_per_token", "ttft_ms")},
        "same_leading_tokens": same, "weights": weights, "roofline": roofline(weights, bandwidth),
        "llama_cpp_extra_buffer_types": workers["llama.cpp"].ready.get("extra_buffer_types", True),
    }
    if load:
        result["busy"] = busy_result(runs, busy_runs, load.describe())
    log(format_result(result))
    return result


def busy_result(quiet: dict[str, list[dict]], busy: dict[str, list[dict]], load: str) -> dict:
    """Each engine's slowdown beside the load (busy / quiet ms per token, per round), and nano_infer's slowdown over
    llama.cpp's: above 1, the load costs nano_infer more."""
    slowdown = {name: [b["ms_per_token"] / q["ms_per_token"] for q, b in zip(quiet[name], busy[name])]
                for name in ENGINES}
    return {"load": load, "runs": busy,
            "median_ms_per_token": {name: statistics.median(t["ms_per_token"] for t in busy[name]) for name in ENGINES},
            "slowdown": {name: paired_ratios(slowdown[name], [1.0] * len(slowdown[name])) for name in ENGINES},
            "slowdown_ratio": paired_ratios(slowdown["nano_infer"], slowdown["llama.cpp"])}


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many tokens two greedy outputs share before they first differ (the engines round differently)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _span(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _grown(result: dict, name: str) -> str:
    grown = result.get("grown_rss_mib", {}).get(name)
    return "" if grown is None else f", grown {grown:.0f} MiB by loading the file and the first chat"


def format_result(result: dict) -> str:
    """The comparison in a few lines: medians, ratios with their rounds and verdict, the floor under both."""
    med, rat, roof, w = result["median"], result["ratios"], result["roofline"], result["weights"]
    lines = [f"-- one chat, {result['model']}: greedy, {result['max_tokens']} tokens, {result['threads']} threads, "
             f"prompts of {_span(result['prompt_tokens'])} tokens, {result['rounds']} rounds; nano_infer with "
             f"quantization={result.get('nano_infer_quantization', 'default')}"]
    for name in ENGINES:
        lines.append(f"  {name:>10}: {med[name]['ms_per_token']:6.1f} ms/token, TTFT {med[name]['ttft_ms']:6.0f} ms "
                     f"(median); peak memory {result['peak_rss_mib'][name]:.0f} MiB{_grown(result, name)}")
    for key, what in (("ms_per_token", "decode ms/token"), ("ttft_ms", "time to first token")):
        r = rat[key]
        lines.append(f"  nano_infer / llama.cpp, {what}: {r['median']:.2f}x (rounds {r['min']:.2f}-{r['max']:.2f}) "
                     f"-> {r['verdict']}")
    if not result.get("llama_cpp_extra_buffer_types", True):
        lines.append("  llama.cpp ran without its extra buffer types (AMX, repacked layouts): its AMX path crashes here")
    lines.append(f"  greedy tokens the two agree on before the first difference: {result['same_leading_tokens']} "
                 f"of {result['max_tokens']}")
    bw = roof["bandwidth_bytes_per_s"]
    lines.append(f"  roofline: {w['tensors']} tensors, {w['stored_bytes'] / 2**20:.1f} MiB as stored, "
                 f"{w['bfloat16_bytes'] / 2**20:.1f} MiB in bfloat16; copy bandwidth {bw / 1e9:.1f} GB/s now -> "
                 f"at least {roof['stored_ms']:.1f} ms/token as stored, {roof['bfloat16_ms']:.1f} in bfloat16")
    for name in ENGINES:
        lines.append(f"  {name:>10} decodes at {med[name]['ms_per_token'] / roof['stored_ms']:.1f}x the as-stored floor")
    if "busy" in result:
        busy = result["busy"]
        lines.append(f"  beside {busy['load']}:")
        for name in ENGINES:
            s = busy["slowdown"][name]
            lines.append(f"  {name:>10}: {busy['median_ms_per_token'][name]:6.1f} ms/token, {s['median']:.2f}x its quiet "
                         f"time (rounds {s['min']:.2f}-{s['max']:.2f})")
        r = busy["slowdown_ratio"]
        lines.append(f"  nano_infer's slowdown / llama.cpp's: {r['median']:.2f}x (rounds {r['min']:.2f}-{r['max']:.2f}) "
                     f"-> {r['verdict'].replace('faster', 'slows less')}")
    return "\n".join(lines)


def run_or_explain(model: str | Path = DEFAULT_GGUF, **options) -> dict:
    """`compare`, or a note saying why not (llama-cpp-python missing, the GGUF file missing) without failing."""
    why = missing()
    if why is None and not Path(model).is_file():
        why = f"llama.cpp comparison skipped: {model} does not exist (`make models` fetches it)"
    if why:
        print(why, flush=True)
        return {"skipped": why}
    return compare(model, **options)


def parse_args(argv=None):
    from .shaped_gguf import SHAPES

    p = argparse.ArgumentParser(prog="python -m nano_infer.bench.llamacpp", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(DEFAULT_GGUF), help="a GGUF file both engines load (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each engine once per round (default: 3)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each engine (default: 2)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per chat (default: 128)")
    p.add_argument("--quantization", choices=("none", "gguf"), help="nano_infer's quantization option: 'gguf' runs "
                   "the file as stored, 'none' dequantizes it (default: the engine's own default)")
    p.add_argument("--shape", choices=("smollm2", *SHAPES), default="smollm2",
                   help="the model: smollm2 is --model; 0.5b / 1.5b a Q4_1 file of Qwen2.5's shape with random weights "
                   "and --model's tokenizer, written once beside it (default: %(default)s)")
    p.add_argument("--busy", type=int, default=0, help="also time each engine beside N busy processes (default: 0)")
    p.add_argument("--busy-kind", choices=KINDS, default="spin", help="what the busy processes run: a spinning loop "
                   "or a nano_infer engine decoding the same file (default: %(default)s)")
    p.add_argument("--json", help="also write the result to this file")
    p.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    if args.busy < 0:
        p.error(f"--busy must be at least 0, got {args.busy}")
    if args.max_tokens < 2:
        p.error(f"--max-tokens must be at least 2 (a decode time needs two tokens), got {args.max_tokens}")
    return args


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.model, args.threads, args.quantization)
        return None
    from .shaped_gguf import shaped_gguf

    model = args.model if args.shape == "smollm2" or missing() else shaped_gguf(args.shape, args.model)
    result = run_or_explain(model, rounds=args.rounds, threads=args.threads, max_tokens=args.max_tokens,
                            quantization=args.quantization, busy=args.busy, busy_kind=args.busy_kind)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
