"""Comparing allowed-token sets with outlines-core's: the tokens a constraint allows, and the ones outlines-core 0.2.x leaves out by design."""
import torch

from nano_infer.constrained import ByteDFA

def dropped_by_outlines(dfa: ByteDFA, state: int, data: bytes) -> bool:
    """The token ends in a non-accepting state, and the state before its last byte accepts."""
    before = dfa.walk(data[:-1], state)
    return bool(dfa.accepting[before]) and not dfa.accepting[dfa.walk(data, state)]


def allowed_ids(constraint) -> set[int]:
    mask = constraint.mask()
    return set(torch.nonzero(mask == 0).flatten().tolist())
