"""The README's second-tier snippet shows the tier at work: the prefix it asks for again is found on
the host (one request on an empty pool would print zeros and an all-zero HostTierStats)."""
import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_tier_snippet_prints_host_hits_and_copies():
    section = README.read_text().split("### A second KV tier", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(README), "exec"), {"LLM": __import__("nano_infer").LLM,  # noqa: S102
                                                   "SamplingParams": __import__("nano_infer").SamplingParams})
    counts, stats = out.getvalue().strip().splitlines()[-2:]
    cached, from_host = map(int, counts.split())
    assert cached > 0 and from_host > 0, counts
    values = dict(re.findall(r"(\w+)=(\d+)", stats))
    assert int(values["offloaded_blocks"]) > 0 and int(values["loaded_blocks"]) > 0, stats
