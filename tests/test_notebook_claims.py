"""Every timed claim in a chapter's prose is computed: the markdown states no measured number and no
verdict on the run; the cell that measures prints them, so a rerun rewrites them.

A rerun on a busy laptop printed "inconclusive" under prose that said "every round runs faster",
and 1.22x fewer steps under "the time saved is smaller than the step ratio". Prose may say how to
read a table and why a result comes out as it does on some hardware; what this run measured (a
ratio, a time, a rate, who won, by how much) is printed by the code above it.
"""
import json
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# a measured quantity: a ratio (1.7x), a time (12 ms, 3.5 s), a rate (2.5 GB/s, 400 tok/s)
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:x|×|ms|µs|us|s|sec|seconds?|minutes?|GB/s|MB/s|"
                      r"tok/s|tokens/s|tokens per second)(?![\w/])")
# a sentence about this run, this machine or its rounds ...
THIS_RUN = re.compile(r"\b(?:this run|the (?:CPU|GPU) run|this machine|here, on|every round|in every round|"
                      r"all (?:the )?rounds|the rounds|the rerun|printed above|in the table|the table(?: above)? shows)\b",
                      re.IGNORECASE)
# ... that gives a verdict or a comparison of costs
VERDICT = re.compile(r"\b(?:pays|wins?|loses?|faster|slower|cheaper|dearer|costs? (?:more|less)|smaller than|"
                     r"larger than|beats?|margin|close call|saves?|hardly|more than|less than|fewer|exactly as many)\b",
                     re.IGNORECASE)
# a comparison of times that points at the measured output
TIMING = re.compile(r"\b(?:time saved|throughput|latency|TTFT|speed-?up|tokens/s)\b", re.IGNORECASE)
OUTPUT = re.compile(r"\b(?:printed|above|measured|here)\b", re.IGNORECASE)
# how to read a verdict, or a figure assumed rather than measured: not a claim about this run
READING = re.compile(r"\b(?:whether|assum\w*|(?:says?|prints?)\b[^.]{0,20}\bwhich)\b", re.IGNORECASE)


def sentences(markdown: str) -> list[str]:
    """Sentences and clauses (split at `;` too) of the prose, list items and headings apart; code left out."""
    text = re.sub(r"```.*?```", "\n\n", markdown, flags=re.DOTALL)  # code blocks
    text = re.sub(r"`[^`]*`", "`…`", text)  # code spans: names, not claims
    text = re.sub(r'"[^"\n]*"', "“…”", text)  # quoted words: the names of verdicts, not verdicts
    text = re.sub(r"\$[^$]*\$", " ", text)  # formulas
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |#))", text):
        block = re.sub(r"\s+", " ", block).strip()
        out += [s.strip() for s in re.split(r"(?<=[.!?:])\s+(?=[A-Z(])|;\s+", block) if s.strip()]
    return out


def timed_claims(markdown: str) -> list[str]:
    """The sentences of a markdown cell that state a measurement or a verdict on one."""
    found = []
    for s in sentences(markdown):
        if READING.search(s):
            continue
        if MEASURED.search(s) or (THIS_RUN.search(s) and VERDICT.search(s)) or \
                (TIMING.search(s) and VERDICT.search(s) and OUTPUT.search(s)):
            found.append(s)
    return found


BAD = [  # what the prose said, and what a rerun contradicted
    "Quoting is where prompt lookup pays: the real model repeats its passage, about half of its up-to-8 proposals "
    "are accepted, a pass yields over five tokens, and at batch 1 the extra positions cost little, so every round "
    "runs faster.",
    "At batch 32 the forward pass is already busy: the positions of rejected proposals are paid for in full (in the "
    "cost table, 4 positions per sequence cost 1.7x one).",
    "With everything submitted at once, continuous batching needs fewer forward passes for the same tokens, but on "
    "a CPU the time saved is smaller than the step ratio (compare the two throughput ratios printed above).",
    "From the next length on, every round finds the copy cheaper, by a margin that grows with the length.",
    "The model only has to get the sign right, and for a choice between a copy and a prefill it has a wide margin "
    "on this machine.",
]
GOOD = [
    "A verify pass yields `tokens per pass` tokens; it pays when that beats what the pass costs over a plain decode step.",
    "On a GPU, where a step costs about the same for 1 or 8 sequences, the step ratio is close to the time ratio.",
    "The verdict column says, per length, whether every round found the load cheaper than the prefill (`copy wins`).",
    "Serving engines switch speculation off above some batch size for this reason.",
    "A block of 16 tokens at 2,560 bytes per token is 40,960 bytes.",
]


@pytest.mark.parametrize("sentence", BAD)
def test_a_claim_the_rerun_contradicted_is_found(sentence):
    assert timed_claims(sentence) == [sentence]


@pytest.mark.parametrize("sentence", GOOD)
def test_how_to_read_a_result_is_not_a_claim(sentence):
    assert timed_claims(sentence) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_chapter_states_a_measurement_in_its_prose(path):
    nb = nbformat.read(path, as_version=4)
    claims = [f"cell {n}: {s}" for n, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
              for s in timed_claims(cell.source)]
    assert not claims, f"{path.name}: print these from the cell that measures them:\n" + "\n".join(claims)


# -- printed ratios ------------------------------------------------------------------------------------
# `nano_infer.bench.timing.Comparison` prints "A 12.30 ms / B 4.10 ms = 3.00x (rounds 2.80-3.40) -> verdict".
# Each such line of every notebook's stored outputs is read back: the ratio must be the one its two medians
# give (up to their printed rounding) and lie within the range of the per-round ratios, and a ratio printed
# beside rounds in any other form fails, so no chapter prints a ratio its own numbers deny.
NUMBER = r"\d[\d,]*(?:\.\d+)?"
LINE = re.compile(rf"(?P<a>{NUMBER}) (?P<unit>ms|s|tok/s) / .*?(?P<b>{NUMBER}) (?P=unit) = (?P<r>\d+\.\d+)x "
                  rf"\((?:rounds|requests) (?P<lo>\d+\.\d+)-(?P<hi>\d+\.\d+)\)")
RATIO_WITH_ROUNDS = re.compile(r"\d+\.\d+x\b.*\b(?:rounds|requests|range)\b")
# chapters whose timed comparisons print through Comparison (13's need the shipped GGUF file, as committed)
EXPECTED = {"06": 1, "09": 5, "10": 2, "12": 1, "13": 5, "15": 4}


def output_lines(path: Path) -> list[str]:
    lines = []
    for cell in json.loads(path.read_text())["cells"]:
        for out in cell.get("outputs", []):
            if out.get("name") == "stdout":
                lines += "".join(out["text"]).splitlines()
    return lines


def value(text: str) -> tuple[float, float]:
    """The printed number and half of its last digit's place: the rounding it may hide."""
    digits = len(text.split(".")[1]) if "." in text else 0
    return float(text.replace(",", "")), 0.5 * 10**-digits


def check(line: str) -> str | None:
    """Why the line's ratio disagrees with its numbers, or None."""
    m = LINE.search(line)
    if m is None:
        return "a ratio beside rounds, not printed as medians / their ratio (timing.Comparison)"
    (a, da), (b, db) = value(m["a"]), value(m["b"])
    r, lo, hi = (float(m[k]) for k in ("r", "lo", "hi"))
    low, high = (a - da) / (b + db), (a + da) / max(b - db, 1e-12)
    if not low - 0.005 <= r <= high + 0.005:
        return f"{r}x is not {m['a']} / {m['b']} (between {low:.3f} and {high:.3f})"
    if not lo - 0.005 <= r <= hi + 0.005:
        return f"{r}x lies outside its rounds' range {lo}-{hi}"
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_printed_ratio_is_its_medians_ratio(path):
    lines = [line for line in output_lines(path) if LINE.search(line) or RATIO_WITH_ROUNDS.search(line)]
    wrong = [(line, why) for line in lines if (why := check(line))]
    assert not wrong, wrong
    assert len(lines) >= EXPECTED.get(path.stem[:2], 0)


@pytest.mark.parametrize("line,ok", [
    ("a 400-token prompt: int4 kernel 2,715 ms / dequantized 8,559 ms = 0.32x (rounds 0.30-0.85) -> x", True),
    ("a 400-token prompt: int4 kernel 2,715 ms / dequantized 8,559 ms = 0.85x (rounds 0.30-0.90) -> x", False),
    ("speculative 29.4 tok/s / plain 35.8 tok/s = 0.82x (rounds 0.80-1.42) -> inconclusive", True),
    ("speculative 29.4 tok/s / plain 35.8 tok/s = 0.82x (rounds 0.90-1.42) -> inconclusive", False),
    ("without the tier 10.81 ms / with it 7.07 ms = 1.53x (requests 0.80-2.22) -> inconclusive", True),
    ("  35.8 -> 29.4 tok/s, speed-up 1.42x (rounds 0.89-1.93): speculation pays", False),
    ("a beam step costs 1.16x a greedy step (rounds 0.91-1.42)", False),
    ("8 rows 0.10 ms / 1 row 0.08 ms = 1.30x (rounds 1.10-1.40)", True),  # 0.095/0.085 to 0.105/0.075
])
def test_the_reader_refuses_a_ratio_its_numbers_deny(line, ok):
    assert (check(line) is None) == ok


def test_chapter_01s_table_ratio_is_its_medians_ratio():
    """Chapter 01 prints its comparison as a table: each row's none / contiguous is the two medians beside it."""
    row = re.compile(r"^\s*\d+ \|\s+[\d,]+\s+\d+ \|\s+(\d+\.\d+)\s+(\d+\.\d+) \|\s+(\d+\.\d)x$")
    path = next(p for p in NOTEBOOKS if p.stem.startswith("01_"))
    rows = [m for line in output_lines(path) if (m := row.match(line))]
    assert len(rows) >= 4
    for m in rows:
        (none, d1), (contiguous, d2) = value(m[1]), value(m[2])
        low, high = (none - d1) / (contiguous + d2), (none + d1) / (contiguous - d2)
        assert low - 0.05 <= float(m[3]) <= high + 0.05, m.group(0)
