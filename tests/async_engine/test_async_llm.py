"""AsyncLLM: deltas that add up to the synchronous engine's text, aborts that free blocks,
errors that reach their requests without killing the engine thread."""
import asyncio
import threading

import pytest

from nano_infer import SamplingParams
from nano_infer.async_engine.async_llm import AsyncLLM
from tests.helpers.engine_checks import assert_idle_and_blocks_free, record_aborts

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
MESSAGES = [{"role": "user", "content": "To be, or not to be?"}]


async def collect(llm, prompt, params=GREEDY, stream=True, **kwargs):
    """(text per sample index, token ids per index, every yielded output), streamed as deltas unless stream=False"""
    texts, tokens, outs = {}, {}, []
    async for out in llm.generate(prompt, params, stream=stream, **kwargs):
        outs.append(out)
        for o in out.outputs:
            texts[o.index] = texts.get(o.index, "") + o.text
            tokens[o.index] = tokens.get(o.index, []) + o.token_ids
    return texts, tokens, outs


def assert_all_blocks_free(llm):
    """Once idle, every block is free or held only by the prefix cache."""
    asyncio.run(collect(llm, "x", SamplingParams(max_tokens=1)))  # the inbox is FIFO: all earlier aborts are done
    assert_idle_and_blocks_free(llm.engine)


def test_deltas_add_up_to_the_sync_engine_text(allm, ref):
    prompts = ["To be, or not", ref.tokenizer.encode("The quick brown fox"), MESSAGES]
    expected = [o.outputs[0] for o in ref.generate(prompts[:1], GREEDY) + ref.generate(prompt_token_ids=prompts[1:2],
                                                                                        sampling_params=GREEDY)
                + ref.chat(MESSAGES, GREEDY)]

    async def main():
        streamed = [collect(allm, p) for p in prompts]
        whole = [collect(allm, p, stream=False) for p in prompts]
        return await asyncio.gather(*streamed, *whole)

    results = asyncio.run(main())
    for (texts, tokens, outs), want in zip(results, expected + expected):
        assert texts[0] == want.text and tokens[0] == want.token_ids
        assert outs[-1].finished and outs[-1].outputs[-1].finish_reason == "length"
    assert all(len(outs) > 1 for _, _, outs in results[:3])  # streamed: many pieces
    assert all(len(outs) == 1 for _, _, outs in results[3:])  # not streamed: one, at the end
    assert results[2][2][0].prompt_token_ids == ref.apply_chat_template(MESSAGES)


def test_a_stop_string_is_never_half_sent(allm, ref):
    """The engine cuts a stop string off once it is complete; its first characters must not have gone out."""
    prompt = "To be, or not"
    base = ref.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    decode = ref.tokenizer.decode
    # a stop string that starts one character before a token boundary, so it arrives in two pieces
    for i in range(3, len(base.token_ids) - 3):
        cut = len(decode(base.token_ids[:i]))
        stop = base.text[cut - 1: cut + 2]
        if base.text.startswith(decode(base.token_ids[:i])) and len(stop) == 3 and base.text.find(stop) == cut - 1:
            break
    else:
        pytest.fail("no token boundary to put a stop string across")
    texts, _, outs = asyncio.run(collect(allm, prompt, SamplingParams(temperature=0, max_tokens=40, stop=stop, ignore_eos=True)))
    assert texts[0] == base.text[: cut - 1]
    assert outs[-1].outputs[0].finish_reason == "stop" and outs[-1].outputs[0].stop_reason == stop


def test_n_samples_stream_per_index(allm, ref):
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    want = ref.generate(["The quick"], params)[0].outputs
    streamed, _, _ = asyncio.run(collect(allm, "The quick", params))
    whole, _, _ = asyncio.run(collect(allm, "The quick", params, stream=False))
    assert streamed == whole == {o.index: o.text for o in want}


def test_bad_input_raises_value_error_and_the_loop_lives_on(allm, ref):
    for prompt, match in [("", "non-empty"), ([], "prompt is empty"), ([1, 10**6], r"\[0, "),
                          ([{"content": "no role"}], "messages"), (42, "prompt must be")]:
        with pytest.raises(ValueError, match=match):
            asyncio.run(collect(allm, prompt))
    with pytest.raises(ValueError, match="max_model_len"):  # a prompt that leaves no room (max_tokens is capped)
        asyncio.run(collect(allm, [5] * 600, SamplingParams(max_tokens=1)))

    async def duplicate_id():
        first = allm.generate("To be, or not", SamplingParams(temperature=0, max_tokens=400, ignore_eos=True), "dup",
                              stream=True)
        tokens = (await anext(first)).outputs[0].token_ids
        with pytest.raises(ValueError, match="already in use"):
            await collect(allm, "The quick", request_id="dup")
        async for out in first:  # the request already running under that id is untouched
            tokens += out.outputs[0].token_ids
            if len(tokens) >= 30:
                break
        await first.aclose()
        return tokens[:30]

    want = ref.generate(["To be, or not"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[0]
    assert asyncio.run(duplicate_id()) == want.token_ids
    assert_all_blocks_free(allm)


def test_leaving_early_aborts_and_frees_blocks(allm, monkeypatch):
    aborted = record_aborts(monkeypatch, allm.engine)
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)

    async def cancelled():  # a client disconnect cancels the task that iterates
        started = asyncio.Event()

        async def consume():
            async for _ in allm.generate("The quick brown", long, "cancelled"):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def both():
        outputs = allm.generate("To be, or not", long, "closed")
        await anext(outputs)
        await outputs.aclose()
        await cancelled()
        while allm.engine.requests:  # with this loop still alive, only an abort ends them early
            await asyncio.sleep(0.01)

    asyncio.run(both())
    assert_all_blocks_free(allm)
    assert sorted(o.request_id for o in aborted if o is not None) == ["cancelled", "closed"]
    assert all(o.outputs[0].finish_reason == "abort" and len(o.outputs[0].token_ids) < 400 for o in aborted if o)


def test_an_engine_error_reaches_the_requests_in_flight_and_the_loop_lives_on(allm, ref, monkeypatch):
    run, failed = allm.engine.runner.run, []

    def fails_once_both_are_running(*args):
        if not failed and len(allm.engine.requests) == 2:
            failed.append(True)
            raise RuntimeError("boom: the forward pass failed")
        return run(*args)

    monkeypatch.setattr(allm.engine.runner, "run", fails_once_both_are_running)

    async def two():
        return await asyncio.gather(collect(allm, "To be"), collect(allm, "The quick"), return_exceptions=True)

    results = asyncio.run(two())
    assert all(isinstance(r, RuntimeError) and "boom" in str(r) for r in results)
    assert_all_blocks_free(allm)
    texts, _, _ = asyncio.run(collect(allm, "To be"))
    assert texts[0] == ref.generate(["To be"], GREEDY)[0].outputs[0].text


def test_requests_from_two_event_loops_in_two_threads(allm, ref):
    prompts = ["To be, or not", "The quick brown fox"]
    results = {}

    def client(i):
        results[i] = asyncio.run(collect(allm, prompts[i]))[0][0]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[0], results[1]] == [o.outputs[0].text for o in ref.generate(prompts, GREEDY)]


def test_a_consumer_that_falls_behind_gets_one_merged_delta(allm, ref):
    async def lagging():
        pieces = []
        async for out in allm.generate("To be, or not", GREEDY, stream=True):
            pieces.append(out.outputs[0].text)
            while allm.engine.requests:  # let the engine finish while we "process" the first piece
                await asyncio.sleep(0.01)
        return pieces

    pieces = asyncio.run(lagging())
    assert len(pieces) <= 2  # the first token(s), then everything queued since, merged (not 24 pieces)
    assert "".join(pieces) == ref.generate(["To be, or not"], GREEDY)[0].outputs[0].text


def test_shutdown_ends_running_requests_and_refuses_new_ones(qwen2_dir):
    llm = AsyncLLM(str(qwen2_dir), dtype="float32")

    async def main():
        outputs = llm.generate("To be", SamplingParams(max_tokens=400, ignore_eos=True))
        await anext(outputs)
        await asyncio.to_thread(llm.shutdown)
        with pytest.raises(RuntimeError, match="shut down"):
            async for _ in outputs:
                pass
        with pytest.raises(RuntimeError, match="shut down"):
            await collect(llm, "To be")
        # `serve` warms the constraint compile pool on its own thread: one that read the vocabulary before the
        # shutdown and makes the pool after it must not start worker processes the shutdown has passed by
        vocab = llm.engine.vocabulary

        async def read_before_the_shutdown(*args):
            return vocab

        llm._tokenizer_thread.run = read_before_the_shutdown
        with pytest.raises(RuntimeError, match="AsyncLLM is shut down"):
            await llm.precompile(SamplingParams(regex="(yes|no)"))

    asyncio.run(main())
    assert not llm.is_running and not llm.engine.requests and llm._compiler.pool is None


def test_a_constraint_is_compiled_in_a_worker_process(allm, monkeypatch):
    """Compiling a regex into a token index can take seconds: it must not run in the process that steps every
    stream. A bad constraint still reaches only its caller, as a ValueError."""
    import nano_infer.constrained.constraint as constraint

    def here(*args):
        raise AssertionError("compiled in the server process")

    monkeypatch.setattr(constraint, "compile_index", here)  # the worker process has its own, unpatched
    params = SamplingParams(regex=r"(ab|c)[0-9]{2}", temperature=0, max_tokens=8)
    texts, _, _ = asyncio.run(collect(allm, "x", params))
    assert len(texts[0]) in (3, 4) and texts[0][-2:].isdigit()
    with pytest.raises(ValueError, match="matches no string"):
        asyncio.run(collect(allm, "x", SamplingParams(regex=r"a[^\s\S]")))
    assert asyncio.run(collect(allm, "x", params))[0] == texts  # cached now, same reply
    assert_all_blocks_free(allm)


def test_a_tenants_constraints_sent_together_compile_one_after_another(allm):
    """Past its share of the compile workers a tenant's request waits for one of its compiles to end, instead of
    failing (vLLM's structured-outputs example sends three at once); each reply matches its own regex."""
    import re

    regexes = [f"(yes|no)-{i}[a-z]{{2}}" for i in range(4)]  # four different constraints of one tenant
    assert allm._compiler.pool is None or allm._compiler.pool.per_tenant < len(regexes)

    async def together():
        return await asyncio.gather(*(collect(allm, "x", SamplingParams(regex=r, temperature=0, max_tokens=12),
                                              tenant="one-client") for r in regexes))

    replies = asyncio.run(together())
    assert all(re.fullmatch(r, texts[0]) for r, (texts, _, _) in zip(regexes, replies)), replies
    assert allm._compiler.pool.per_tenant < len(regexes)  # they could not all have compiled at once
    assert_all_blocks_free(allm)
