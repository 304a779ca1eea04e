"""`LLM`: vLLM's offline API over LLMEngine, so a vLLM user's script runs unchanged.

    llm = LLM()                                        # the default model for this machine
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].text
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=32))
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections.abc import Sequence as Seq

from tqdm.auto import tqdm

from .beam import BeamSearchOutput, BeamSearchParams, BeamSearchSequence, length_penalised
from .text.chat_template import chat_token_ids, template_messages
from .engine.llm_engine import LLMEngine
from .engine.vllm_metrics import Metric, get_metrics
from .inputs import PromptType, TokensPrompt, parse_prompt
from .outputs import RequestOutput
from .sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, **engine_options):
        self.engine = LLMEngine(model, **engine_options)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the engine's tensor-parallel workers (nothing to do with one process)."""
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts: PromptType | Seq[PromptType] | None = None,
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 prompt_token_ids: list[list[int]] | list[int] | None = None,
                 use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        A prompt is a string, a TextPrompt or a TokensPrompt (nano_infer.inputs), alone or in a list;
        `prompt_token_ids=` is the older way to pass ids. Without sampling_params, the model's
        generation_config.json decides (`get_default_sampling_params`), as in vLLM. All requests are
        queued first, so the scheduler batches them continuously; bad input in any one raises
        ValueError before anything runs. The progress bar shows by default when stderr is a terminal.
        """
        if prompts is None and prompt_token_ids is None:
            raise ValueError("give prompts (strings, TextPrompt or TokensPrompt dicts) or prompt_token_ids")
        if prompts is not None and (isinstance(prompts, (str, dict)) or not isinstance(prompts, Seq)):
            prompts = [prompts]  # one prompt (anything else is refused by parse_prompt, naming its type)
        if prompt_token_ids is not None:
            if prompt_token_ids and isinstance(prompt_token_ids[0], int):
                prompt_token_ids = [prompt_token_ids]
            texts = prompts if prompts is not None else [None] * len(prompt_token_ids)
            if len(texts) != len(prompt_token_ids):
                raise ValueError(f"got {len(texts)} prompts for {len(prompt_token_ids)} lists of prompt_token_ids")
            prompts = [TokensPrompt(prompt_token_ids=ids, **({"prompt": t} if t is not None else {}))
                       for t, ids in zip(texts, prompt_token_ids)]
        texts, token_ids, salts = zip(*map(parse_prompt, prompts)) if prompts else ((), (), ())
        if isinstance(sampling_params, Seq):
            if len(sampling_params) != len(texts):
                raise ValueError(f"got {len(sampling_params)} SamplingParams for {len(texts)} prompts")
            params = list(sampling_params)
        else:
            params = [sampling_params or self.get_default_sampling_params()] * len(texts)
        params = [p if salt is None else dataclasses.replace(p, cache_salt=salt) for p, salt in zip(params, salts)]
        return self._add_and_run(list(texts), list(token_ids), params, use_tqdm)

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget every cached prefix block (LLMEngine.reset_prefix_cache); True when none is left."""
        return self.engine.reset_prefix_cache()

    def get_metrics(self) -> list[Metric]:
        """vLLM's: the engine's vllm:* series now, as Counter / Gauge / Histogram records (engine/vllm_metrics.py)."""
        return get_metrics(self.engine)

    def get_tokenizer(self):
        """The Hugging Face tokenizer the engine encodes and decodes with."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate uses without sampling_params: SamplingParams() with the model's
        generation_config.json values (temperature, top_p, top_k, min_p, repetition_penalty,
        max_new_tokens as max_tokens), as vLLM's default generation_config="auto" does."""
        path = self.engine.model_dir / "generation_config.json"
        config = json.loads(path.read_text()) if path.exists() and not self.engine.gguf_file else {}
        names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                 "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
        return SamplingParams(**{ours: config[theirs] for theirs, ours in names.items() if config.get(theirs) is not None})

    def _add_and_run(self, prompts: list, token_ids: list, params: list, use_tqdm: bool | None) -> list[RequestOutput]:
        """Queue every request (a bad one raises before anything runs), then run them all."""
        ids = [f"{next(self._ids)}" for _ in prompts]
        added = []
        try:
            for rid, prompt, tokens, p in zip(ids, prompts, token_ids, params):
                self.engine.add_request(rid, prompt, p, prompt_token_ids=tokens)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            raise
        return self._run(ids, use_tqdm)

    def beam_search(self, prompts, params: BeamSearchParams, use_tqdm: bool | None = None) -> list[BeamSearchOutput]:
        """Beam search (chapter 11) for each prompt: a string, a TextPrompt or a TokensPrompt.

        Each prompt is one request whose beams run inside the engine, batched with each other
        and with whatever else is queued; each output holds `beam_width` hypotheses, best first,
        each with `tokens` = prompt + output (vLLM's shape) and its score.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be BeamSearchParams, got {type(params).__name__}")
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        texts, token_ids, salts = zip(*map(parse_prompt, prompts)) if prompts else ((), (), ())
        beams = [params if salt is None else dataclasses.replace(params, cache_salt=salt) for salt in salts]
        outs = self._add_and_run(list(texts), list(token_ids), beams, use_tqdm)
        return [BeamSearchOutput([self._beam_sequence(o, c, params) for c in o.outputs]) for o in outs]

    def _beam_sequence(self, out: RequestOutput, c, params: BeamSearchParams) -> BeamSearchSequence:
        text = c.text
        if params.include_stop_str_in_output and c.finish_reason == "stop":
            text += self.tokenizer.decode(c.token_ids[-1:])
        score = length_penalised([c.cumulative_logprob], len(c.token_ids), params.length_penalty)[0]
        return BeamSearchSequence(list(out.prompt_token_ids) + list(c.token_ids), text, c.cumulative_logprob, score,
                                  c.finish_reason, len(out.prompt_token_ids))

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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool | None = None,
                            allow_special_tokens: bool = False, **kwargs) -> list[int]:
        """Token ids of a conversation. Control tokens typed in a message's content stay text (a user
        cannot open a system turn) unless `allow_special_tokens=True` (see chat_template).
        `add_generation_prompt`: the argument, else what a `Chat` carries (a server request's), else True."""
        kwargs = {"add_generation_prompt": True, **getattr(messages, "template_kwargs", {}), **kwargs}  # a Chat's tools
        if add_generation_prompt is not None:
            kwargs["add_generation_prompt"] = add_generation_prompt
        return chat_token_ids(self.tokenizer, template_messages(messages), allow_special_tokens=allow_special_tokens,
                              **kwargs)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool | None = None, **template_kwargs) -> list[RequestOutput]:
        """One conversation (a list of messages) or several; the chat template is applied here. Each
        output's `prompt` is the rendered conversation, as vLLM's chat example prints it."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        token_ids = [self.apply_chat_template(c, **template_kwargs) for c in conversations]
        texts = [self.tokenizer.decode(ids) for ids in token_ids]
        return self.generate(texts, sampling_params, prompt_token_ids=token_ids, use_tqdm=use_tqdm)

