"""Two commits' nano_infer figures side by side: `make bench` on each, alternating, as ratios.

    python scripts/bench_ab.py e62fb52 HEAD                    # before / after a change, 3 alternating rounds
    python scripts/bench_ab.py main HEAD --rounds 5 --model default --dtype bfloat16

A refactor or an optimisation is judged by the ratio after/before of each nano_infer figure (tokens/s of
every workload, one chat's ms per token and time to first token, decode alone), taken per round from runs
made back to back and in alternating order, so a machine that slows down mid-run moves both sides alike.
Each commit runs from a worktree of its own (under --workdir) with this checkout's environment. Check
`uptime` first: a figure taken while anything else loads the machine is not a figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worktree(ref: str, workdir: Path) -> Path:
    sha = subprocess.check_output(["git", "rev-parse", "--short", ref], cwd=ROOT, text=True).strip()
    path = workdir / sha
    if not path.exists():
        subprocess.check_call(["git", "worktree", "add", "--detach", "-q", str(path), sha], cwd=ROOT)
        (path / ".cache").symlink_to(ROOT / ".cache")  # the GGUF file and the random-weight shapes, built once
    return path


def run(tree: Path, bench_args: list[str], out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.check_call([sys.executable, "-m", "nano_infer.bench", "--engines", "nano_infer", "--rounds", "1",
                           "--out", str(out), *bench_args], cwd=tree, env=env, stdout=subprocess.DEVNULL)
    (report,) = sorted(out.glob("bench-*.json"))[-1:]
    return json.loads(report.read_text())


def figures(report: dict) -> dict[str, float]:
    """Every nano_infer figure of one run, higher is better (times are inverted)."""
    out = {}
    for entry in report["models"]:
        key = f"{entry['model']} {entry['dtype']}"
        for w in entry["workloads"]:
            out[f"{key}, {w['num_requests']} requests, tok/s"] = w["median"]["nano_infer"]["tokens_per_s"]
        if "latency" in entry:
            out[f"{key}, one chat, 1/(ms per token)"] = 1 / entry["latency"]["ms_per_token"]["nano_infer"]
            out[f"{key}, one chat, 1/TTFT"] = 1 / entry["latency"]["ttft_ms"]["nano_infer"]
        if "decode" in entry:
            out[f"{key}, decode alone, tok/s"] = entry["decode"]["tokens_per_s"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "nano_infer_bench_ab"))
    args, bench_args = p.parse_known_args(argv)
    workdir = Path(args.workdir)
    trees = {"before": worktree(args.before, workdir), "after": worktree(args.after, workdir)}
    per_round = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            print(f"round {r + 1}/{args.rounds}: {side} ({trees[side].name})", flush=True)
            per_round[side].append(figures(run(trees[side], bench_args, workdir / "out" / f"{side}-{r}")))
    print(f"\nafter / before, {args.after} vs {args.before}, per round (median; >= 0.97 is within noise):")
    for key in per_round["before"][0]:
        ratios = [a[key] / b[key] for a, b in zip(per_round["after"], per_round["before"])]
        print(f"  {key:<60} {statistics.median(ratios):.3f}  (rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
