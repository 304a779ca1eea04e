"""The prompts of one request as engine requests queued together, their outputs as one stream.

OpenAI's /v1/completions takes several prompts in one body (lm-eval sends its batches so). Each
prompt becomes its own AsyncLLM request, all started at once, so the scheduler batches them as it
batches any concurrent requests; their outputs are merged into one stream in the order they
come, with OpenAI's numbering of the choices: sample j of prompt i is choice i * n + j.

Nothing is yielded before every prompt has been accepted by the engine (has its first output), so
bad input in any prompt raises before the reply begins, when it can still be a 400. A failure in
one prompt, or the consumer leaving (a disconnect), cancels the others, which aborts them and
frees their KV blocks.

The merging queue holds at most one output per prompt: a consumer that stops reading (a client
that stops reading its stream) stops the pumps, and AsyncLLM's mailbox keeps only the newest
output, so a stalled stream holds a few outputs, not one per step.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

from ..outputs import RequestOutput

_DONE = object()  # a prompt's stream has ended


async def fan_out(llm, prompts: list, params, request_id: str, *, stream: bool, echo_only: bool = False,
                  tenant: str | None = None, priority: int = 0):
    """RequestOutputs of every prompt, choices renumbered. `echo_only` (max_tokens 0 with echo) drops
    what was generated: the one token sampled from the prompt's last row, which costs no extra pass.
    `tenant` and `priority` go to AsyncLLM's admission."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=len(prompts))

    async def pump(i: int, prompt) -> None:
        try:
            rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            # stream=True: deltas (output_kind DELTA), each chunk's new text; False: one final output (FINAL_ONLY)
            async for out in llm.generate(prompt, params, rid, stream=stream, tenant=tenant, priority=priority):
                await queue.put((i, out))
            await queue.put((i, _DONE))
        except Exception as e:  # noqa: BLE001 - raised to the consumer, which cancels the other prompts
            await queue.put((i, e))

    tasks = [asyncio.ensure_future(pump(i, p)) for i, p in enumerate(prompts)]
    held, accepted, live = [], set(), len(tasks)
    try:
        while live:
            i, item = await queue.get()
            if isinstance(item, Exception):
                if isinstance(item, ValueError) and len(prompts) > 1:
                    raise ValueError(f"prompt {i}: {item}") from item
                raise item
            if item is _DONE:
                live -= 1
                continue
            held.append(_renumbered(item, i * params.n, echo_only))
            accepted.add(i)
            if len(accepted) == len(prompts):
                for out in held:
                    yield out
                held = []
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _renumbered(out: RequestOutput, first_index: int, echo_only: bool) -> RequestOutput:
    """`out` with its choices numbered from `first_index`; with `echo_only`, emptied of generated tokens."""
    outputs = [replace(o, index=first_index + o.index) for o in out.outputs]
    if echo_only:
        outputs = [replace(o, text="", token_ids=[], logprobs=None if o.logprobs is None else [], stop_reason=None,
                           finish_reason="length" if o.finished else None) for o in outputs]
    return replace(out, outputs=outputs)
