"""The README's snippets run as written: a reader's first contact with the package must work.

Each Python block runs alone, pasted line by line into a fresh interactive prompt (`code.InteractiveConsole`,
what `python` gives a reader): a block that leans on a name from an earlier one, or that a prompt cannot take
(a statement right after an indented block with no blank line), fails. Shell lines: `nano-infer generate`
runs for real; a `nano-infer serve` line would serve forever, so its options are checked by running it with
`--help` appended; `make` lines are what `make test` itself runs; the two-machine torchrun line needs two machines.
"""
import code
import concurrent.futures
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GGUF = ROOT / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
NANO_INFER = Path(sys.executable).parent / "nano-infer"


def blocks(path: Path, language: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", path.read_text(), re.S)]


def shell_lines(path: Path, command: str) -> list[list[str]]:
    lines = [line.split("#")[0].strip() for block in blocks(path, "bash") for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(command + " ")]


class Prompt(code.InteractiveConsole):
    """An interactive prompt that raises what it would print: a SyntaxError or a traceback."""

    def showsyntaxerror(self, filename=None, **kwargs):
        raise sys.exc_info()[1]

    def showtraceback(self):
        raise sys.exc_info()[1]


def paste(block: str) -> str:
    """What a fresh prompt prints when `block` is pasted into it, then Enter on an empty line."""
    out, prompt = io.StringIO(), Prompt({"__name__": "__console__"})
    with contextlib.redirect_stdout(out):
        for line in block.splitlines() + [""]:
            prompt.push(line)
    return out.getvalue()


def run_python_blocks(path: Path) -> list[str]:
    return [paste(block) for block in blocks(path, "python")]


def test_a_prompt_refuses_what_a_reader_could_not_paste():
    with pytest.raises(SyntaxError):
        paste("for i in range(2):\n    x = i\nprint(x)")  # no blank line after the loop
    with pytest.raises(NameError):
        paste("print(llm)")  # a name from another snippet
    assert paste("for i in range(2):\n    x = i\n\nprint(x)") == "1\n"


@pytest.mark.slow
def test_readme_python_runs_each_snippet_alone_and_the_gguf_model_answers(monkeypatch):
    if not GGUF.exists():
        pytest.skip(f"{GGUF} is missing: `make models` fetches it (make test does)")
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the checkout
    printed = run_python_blocks(ROOT / "README.md")
    by_block = dict(zip(blocks(ROOT / "README.md", "python"), printed))
    gguf = next(out for block, out in by_block.items() if "capital of France" in block)
    assert "Paris" in gguf, gguf
    vllm = next(out for block, out in by_block.items() if "StructuredOutputsParams" in block)
    assert vllm.splitlines()[-1] == "['Positive', 'Negative']", vllm
    beams = next(out for block, out in by_block.items() if "beam_search" in block)
    scores = [float(line.split()[0]) for line in beams.splitlines() if re.match(r"-\d+\.\d+ -\d+\.\d+ (stop|length)", line)]
    assert len(scores) == 4 and scores == sorted(scores, reverse=True)  # the beam-search block's 4 hypotheses


def test_notebooks_readme_python_runs():
    """The exercise snippet runs its checker on the unfilled stub, which reports it as not right yet."""
    assert "top_k_top_p_filter: not yet right" in "".join(run_python_blocks(ROOT / "notebooks/README.md"))


def run_command_line(argv: list[str]) -> tuple[list[str], subprocess.CompletedProcess | str]:
    """The README's `nano-infer` line as a reader runs it (shorter, or `--help` for `serve`), or why it cannot run."""
    if "--model" in argv and not (ROOT / argv[argv.index("--model") + 1]).exists():
        return argv, f"{argv[argv.index('--model') + 1]} is missing: `make models` fetches it (make test does)"
    if argv[1] == "serve":  # would serve until stopped: check that it takes these options
        argv = argv + ["--help"]
    elif "--max-tokens" not in argv:
        argv = argv + ["--max-tokens", "8"]  # the same command, shorter
    return argv, subprocess.run([str(NANO_INFER), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_readme_command_lines_work():
    """Every `nano-infer` line, two at a time: each process mostly waits on its imports and model load."""
    lines = shell_lines(ROOT / "README.md", "nano-infer")
    assert len(lines) >= 6
    missing = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for argv, done in pool.map(run_command_line, lines):
            if isinstance(done, str):
                missing.append(done)
                continue
            assert done.returncode == 0, (shlex.join(argv), done.stderr[-2000:])
            assert done.stdout.strip(), (shlex.join(argv), "printed nothing")
    if missing:
        pytest.skip("; ".join(missing))


def test_the_tier_snippet_prints_host_hits_and_copies():
    """The second-tier snippet shows the tier at work: the prefix it asks for again is found on the host (one
    request on an empty pool would print zeros and an all-zero HostTierStats)."""
    section = (ROOT / "README.md").read_text().split("### A second KV tier", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    counts, stats = paste(block).strip().splitlines()[-2:]  # alone, at a fresh prompt
    cached, from_host = map(int, counts.split())
    assert cached > 0 and from_host > 0, counts
    values = dict(re.findall(r"(\w+)=(\d+)", stats))
    assert int(values["offloaded_blocks"]) > 0 and int(values["loaded_blocks"]) > 0, stats
