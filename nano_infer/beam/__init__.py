"""Chapter 11: beam search on shared blocks (params.py: the API; search.py: the rules; plugin.py: the engine side)."""
from .params import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from .plugin import BeamSearcher
from .search import BeamState, length_penalised, num_candidates

__all__ = ["BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence", "BeamSearcher", "BeamState",
           "length_penalised", "num_candidates"]
