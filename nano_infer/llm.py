"""`LLM`: vLLM's offline API over LLMEngine, so a vLLM user's script runs unchanged.

    llm = LLM()                                        # the default model for this machine
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].text
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=32))
"""
from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence as Seq

from tqdm.auto import tqdm

from .engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, **engine_options):
        self.engine = LLMEngine(model, **engine_options)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: str | list[str] | None = None,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 prompt_token_ids: list[list[int]] | None = None, use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        All requests are queued first, so the scheduler batches them continuously; bad
        input in any one raises ValueError before anything runs. The progress bar over
        finished requests shows by default when stderr is a terminal.
        """
        if prompts is None and prompt_token_ids is None:
            raise ValueError("give prompts (strings) or prompt_token_ids (lists of token ids)")
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompt_token_ids is not None and prompt_token_ids and isinstance(prompt_token_ids[0], int):
            prompt_token_ids = [prompt_token_ids]
        count = len(prompts) if prompts is not None else len(prompt_token_ids)
        if isinstance(sampling_params, Seq):
            if len(sampling_params) != count:
                raise ValueError(f"got {len(sampling_params)} SamplingParams for {count} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params or SamplingParams()] * count
        ids = [f"{next(self._ids)}" for _ in range(count)]
        added = []
        try:
            for i, rid in enumerate(ids):
                prompt = prompts[i] if prompts is not None else None
                tokens = prompt_token_ids[i] if prompt_token_ids is not None else None
                self.engine.add_request(rid, prompt, params[i], prompt_token_ids=tokens)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool | None) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        if use_tqdm is None:
            use_tqdm = sys.stderr.isatty()
        bar = tqdm(total=len(ids), desc="requests", unit="req", disable=not use_tqdm)
        try:
            while len(results) < len(ids):
                for out in self.engine.step():
                    if out.error is not None:
                        raise RuntimeError(f"request {out.request_id} failed: {out.error}") from out.error
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        except BaseException:  # Ctrl-C or an error: leave the engine clean for the next call
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        finally:
            bar.close()
        return [results[rid] for rid in ids]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool | None = None, **template_kwargs) -> list[RequestOutput]:
        """One conversation (a list of messages) or several; the chat template is applied here."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        token_ids = [self.apply_chat_template(c, **template_kwargs) for c in conversations]
        return self.generate(prompt_token_ids=token_ids, sampling_params=sampling_params, use_tqdm=use_tqdm)
