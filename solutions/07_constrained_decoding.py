"""Chapter 07, reference solutions: `check.allowed_tokens`, `check.choice_regex`."""
import re

from nano_infer.constrained.byte_dfa import ByteDFA


def allowed_tokens(dfa: ByteDFA, state: int, token_bytes: list) -> set[int]:
    """Ids of the tokens whose bytes the DFA can read from `state` without rejecting.

    dfa.transitions[s, b] is the next state or -1; token_bytes[i] is token i's bytes (None or b""
    for tokens that spell nothing, which are never allowed).
    """
    allowed = set()
    for token_id, data in enumerate(token_bytes):
        if not data:
            continue
        s = state
        for byte in data:
            s = int(dfa.transitions[s, byte])
            if s < 0:
                break
        if s >= 0:
            allowed.add(token_id)
    return allowed


def choice_regex(choices: list[str]) -> str:
    """A regex that matches exactly the given strings (in full), whatever characters they contain."""
    return "(" + "|".join(re.escape(c) for c in choices) + ")"
