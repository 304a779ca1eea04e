"""Chapter 09: speculative decoding. Propose several tokens cheaply (n-gram prompt lookup or a
draft model), verify them all in one forward pass of the target, keep the longest accepted
prefix plus one token, roll the KV of the rest back."""
from ..config import SpeculativeConfig
from .decoder import SpeculativeDecoder, SpecStats
from .draft import DraftProposer
from .ngram import propose_ngram
from .rejection import accept_greedy, accept_sampled, target_probs

__all__ = ["DraftProposer", "SpecStats", "SpeculativeConfig", "SpeculativeDecoder", "accept_greedy",
           "accept_sampled", "propose_ngram", "target_probs"]
