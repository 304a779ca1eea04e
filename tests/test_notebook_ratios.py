"""Every timed comparison a committed chapter printed agrees with its own numbers.

`nano_infer.bench.timing.Comparison` prints "A 12.30 ms / B 4.10 ms = 3.00x (rounds 2.80-3.40) -> verdict".
Here each such line of every notebook's stored outputs is read back: the ratio must be the one its two
medians give (up to their printed rounding) and lie within the range of the per-round ratios, and a
ratio printed beside rounds in any other form fails, so no chapter can print a ratio its numbers deny.
"""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NUMBER = r"\d[\d,]*(?:\.\d+)?"
LINE = re.compile(rf"(?P<a>{NUMBER}) (?P<unit>ms|s|tok/s) / .*?(?P<b>{NUMBER}) (?P=unit) = (?P<r>\d+\.\d+)x "
                  rf"\((?:rounds|requests) (?P<lo>\d+\.\d+)-(?P<hi>\d+\.\d+)\)")
RATIO_WITH_ROUNDS = re.compile(r"\d+\.\d+x\b.*\b(?:rounds|requests|range)\b")
# chapters whose timed comparisons print through Comparison (13's need the shipped GGUF file, as committed)
EXPECTED = {"06": 1, "09": 5, "10": 2, "12": 1, "13": 5}


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
