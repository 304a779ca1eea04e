"""Execute notebooks several times and check two things a committed notebook promises.

1. No stall: each run's wall time stays within `--max-overhead` (2x) of the sum of its cells'
   own execution times (a kernel that hangs between cells, as ipywidgets' Output once made
   nbclient do, shows up here and nowhere else).
2. Reproducible timings: every ratio a cell prints (a number followed by "x" or "×") lands
   within `--tolerance` (30%) of the ratio printed in the same place of the committed notebook.

    python scripts/rerun_notebooks.py notebooks/00_naive_decode.ipynb notebooks/06_paged_attention.ipynb --runs 3
    python scripts/rerun_notebooks.py notebooks/0[2479]_*.ipynb --runs 5 --no-ratios

The committed files are never written. Exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat
from nbclient import NotebookClient

RATIO = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?)[x×](?!\w)")  # 2.3x, 1,025x; not "3 x 32"


def printed_ratios(nb) -> dict[tuple[int, int], float]:
    """{(cell index, k): the k-th ratio the cell printed} over the stdout of every code cell."""
    found = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        for k, m in enumerate(RATIO.finditer(text)):
            found[i, k] = float(m.group(1).replace(",", ""))
    return found


def cell_seconds(nb) -> float:
    """Sum over code cells of execute_input -> execute_reply, as nbclient records them."""
    total = 0.0
    for cell in nb.cells:
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            total += (datetime.fromisoformat(end.replace("Z", "+00:00"))
                      - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()
    return total


def run_once(path: Path, timeout: int):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            record_timing=True, store_widget_state=False)
    start = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=0.30, help="allowed relative distance of a ratio (default 0.30)")
    p.add_argument("--max-overhead", type=float, default=2.0, help="allowed wall time / sum of cell times (default 2)")
    p.add_argument("--no-ratios", action="store_true", help="check only for stalls")
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = p.parse_args(argv)
    failed = False
    for path in args.notebooks:
        committed = printed_ratios(nbformat.read(path, as_version=4))
        print(f"== {path}: {len(committed)} printed ratios committed", flush=True)
        reruns: dict[tuple[int, int], list[float]] = {key: [] for key in committed}
        for run in range(1, args.runs + 1):
            nb, wall = run_once(path, args.timeout)
            cells = cell_seconds(nb)
            stall = wall > args.max_overhead * cells
            failed |= stall
            print(f"  run {run}: wall {wall:.1f} s, cells {cells:.1f} s, ratio {wall / cells:.2f}" + ("  STALL" if stall else ""),
                  flush=True)
            got = printed_ratios(nb)
            for key in committed:
                reruns[key].append(got.get(key, float("nan")))
        if args.no_ratios:
            continue
        for (cell, k), value in committed.items():
            values = reruns[cell, k]
            worst = max(abs(v / value - 1) if value else abs(v) for v in values)
            bad = not worst <= args.tolerance  # NaN (the ratio vanished) counts as bad
            failed |= bad
            print(f"  cell {cell} ratio {k}: committed {value:g}, reruns {', '.join(f'{v:g}' for v in values)}; "
                  f"worst {worst:.1%}" + ("  OUT OF RANGE" if bad else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
