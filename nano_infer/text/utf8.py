"""A text the engine is handed must be one it can encode."""


def check_utf8(text: str, what: str) -> None:
    """JSON can carry a lone surrogate ("\\ud800"), which is not a character and cannot be tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} contains {text[e.start:e.end]!r} at character {e.start}: a lone UTF-16 surrogate, "
                         f"not a character") from None
