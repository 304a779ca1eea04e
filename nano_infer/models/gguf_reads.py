"""What transformers reads from a GGUF file, kept: its config and its tokenizer.

transformers builds both from the file's metadata, the tokenizer from its whole vocabulary and merges: seconds
of work for every process that opens the file. The first read is saved in transformers' own format (JSON and
tokenizer.json, no pickles) under the user's cache, keyed by the file's path, size and time and by
transformers' version, and later processes load that; within a process a later engine gets a copy of the
object it already has.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
from pathlib import Path

_READS: dict[tuple, bytes] = {}


def read_from_gguf(auto_class, path: Path):
    """`auto_class.from_pretrained` (AutoConfig or AutoTokenizer) of the GGUF file at `path`, from the cache if
    it holds it."""
    import transformers

    stat = path.stat()
    key = (auto_class.__name__, str(path.resolve()), stat.st_mtime_ns, stat.st_size, transformers.__version__)
    if key in _READS:
        return pickle.loads(_READS[key])
    saved = gguf_cache_dir() / hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    if (saved / "complete").is_file():
        read = auto_class.from_pretrained(saved)
    else:
        read = auto_class.from_pretrained(path.parent, gguf_file=path.name)
        _save(read, saved)
    _READS[key] = pickle.dumps(read)
    return read


def gguf_cache_dir() -> Path:
    """$NANO_INFER_CACHE/gguf, else $XDG_CACHE_HOME/nano_infer/gguf, else ~/.cache/nano_infer/gguf."""
    if os.environ.get("NANO_INFER_CACHE"):
        return Path(os.environ["NANO_INFER_CACHE"]) / "gguf"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nano_infer" / "gguf"


def _save(read, saved: Path) -> None:
    """Whole or not at all (a finished folder is renamed into place), and never an error: where the cache cannot be
    written, the next process reads the file again."""
    try:
        saved.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=saved.parent))
    except OSError:
        return
    try:
        read.save_pretrained(partial)
        (partial / "complete").touch()
        partial.rename(saved)
    except OSError:  # unwritable, or another process saved it first
        shutil.rmtree(partial, ignore_errors=True)
