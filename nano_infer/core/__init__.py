"""The records every part of the engine shares, at the bottom of the package: a `Sequence` and its `Request`,
one step's scheduled batch, the block copies it carries and the plug-in base.

Everything imports down to this package and it imports nothing above it, so the KV memory (kv/), the prefix
caches (prefix/) and the engine (engine/) read the same records without reading each other. A feature keeps its
own state per sequence (the prefix cache its handles and hashes, beam search its beams) instead of adding fields here.
"""
from .batch import BlockSwap, ScheduledSeq, SchedulerOutput
from .plugin import EnginePlugin, Phase, Sequences, StepContext
from .request import Request
from .sequence import SamplingState, Sequence, SequenceStatus

__all__ = ["BlockSwap", "EnginePlugin", "Phase", "Request", "SamplingState", "ScheduledSeq",
           "SchedulerOutput", "Sequence", "SequenceStatus", "Sequences", "StepContext"]
