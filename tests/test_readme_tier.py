"""The README's second-tier snippet shows the tier at work: the prefix it asks for again is found on
the host (one request on an empty pool would print zeros and an all-zero HostTierStats)."""
import re
from pathlib import Path

from tests.test_readme import paste

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_tier_snippet_prints_host_hits_and_copies():
    section = README.read_text().split("### A second KV tier", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    counts, stats = paste(block).strip().splitlines()[-2:]  # alone, at a fresh prompt
    cached, from_host = map(int, counts.split())
    assert cached > 0 and from_host > 0, counts
    values = dict(re.findall(r"(\w+)=(\d+)", stats))
    assert int(values["offloaded_blocks"]) > 0 and int(values["loaded_blocks"]) > 0, stats
