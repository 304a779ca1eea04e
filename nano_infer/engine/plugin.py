"""EnginePlugin: a part beside the step loop, entered through one of four narrow seams.

`LLMEngine.step` stays the same short loop whatever is switched on; a feature that needs more
than scheduling, one forward pass and sampling is a plug-in here. Speculative decoding
proposes before the pass (`adjust`) and verifies its own rows after it (`claims`, `process`);
the step recorder of the memory plots looks at each finished step (`after_step`).
"""
from __future__ import annotations


class EnginePlugin:
    """Every hook is optional; the engine calls the plug-ins in the order it was given them."""

    def adjust(self, batch, runner) -> None:
        """Before the forward pass: change what the scheduled entries compute (`batch` is the
        SchedulerOutput; `runner` can run other models on the same block tables)."""

    def claims(self, entry) -> bool:
        """Does this plug-in turn `entry`'s logit rows into tokens, instead of the sampler?"""
        return False

    def process(self, claimed: list, logits, outputs) -> None:
        """`claimed` is [(entry, first logit row)]: append their tokens through `outputs`
        (an OutputProcessor; `outputs.isolated` ends a request that raises alone)."""

    def after_step(self, engine, batch, start: float) -> None:
        """After outputs are processed and the caches committed."""
