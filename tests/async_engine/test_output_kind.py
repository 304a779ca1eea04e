"""AsyncLLM.generate honours vLLM's output_kind: CUMULATIVE (the default) yields everything so far, DELTA what is
new, FINAL_ONLY one output; the older `stream=` switch wins when given."""
import asyncio
from dataclasses import replace

import pytest

from nano_infer import BeamSearchParams, SamplingParams
from nano_infer.sampling_params import RequestOutputKind

N = 20
GREEDY = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, logprobs=2)
PROMPT = "To be, or not"


def run(llm, params, **kwargs):
    async def outputs():
        return [out async for out in llm.generate(PROMPT, params, **kwargs)]

    return asyncio.run(outputs())


def per_index(outs):
    """{sample index: [its CompletionOutput in each yielded output that holds it]}"""
    rows = {}
    for out in outs:
        for o in out.outputs:
            rows.setdefault(o.index, []).append(o)
    return rows


def assert_grows_to(rows, want):
    """Each output of a sample extends the one before (text, token ids, logprobs) and the last is `want`."""
    for before, after in zip(rows, rows[1:]):
        assert after.text.startswith(before.text) and after.token_ids[: len(before.token_ids)] == before.token_ids
        assert (after.text, after.token_ids) != (before.text, before.token_ids) or after.finished
    for o in rows:
        assert o.logprobs is None or len(o.logprobs) == len(o.token_ids)
    last = rows[-1]
    assert (last.text, last.token_ids, last.finish_reason) == (want.text, want.token_ids, want.finish_reason)
    if want.logprobs is not None:
        assert [list(step) for step in last.logprobs] == [list(step) for step in want.logprobs]


def test_each_output_kind_against_the_sync_engine(allm, ref):
    want = ref.generate([PROMPT], GREEDY)[0].outputs[0]
    cumulative = run(allm, GREEDY)  # the default kind
    assert GREEDY.output_kind is RequestOutputKind.CUMULATIVE and len(cumulative) > 1
    assert_grows_to(per_index(cumulative)[0], want)
    assert [out.finished for out in cumulative] == [False] * (len(cumulative) - 1) + [True]

    for deltas in (run(allm, replace(GREEDY, output_kind=RequestOutputKind.DELTA)), run(allm, GREEDY, stream=True)):
        assert len(deltas) > 1 and deltas[-1].finished
        assert "".join(o.outputs[0].text for o in deltas) == want.text
        assert [t for o in deltas for t in o.outputs[0].token_ids] == want.token_ids
        assert sum(len(o.outputs[0].logprobs) for o in deltas) == N

    for final in (run(allm, replace(GREEDY, output_kind=RequestOutputKind.FINAL_ONLY)),
                  run(allm, replace(GREEDY, output_kind=RequestOutputKind.DELTA), stream=False)):
        assert len(final) == 1 and final[0].finished
        assert_grows_to(final[0].outputs, want)


def test_a_cumulative_stream_never_shows_the_start_of_a_stop_string(allm, ref):
    base = ref.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    decode = ref.tokenizer.decode
    for i in range(3, len(base.token_ids) - 3):  # a stop string that starts on a token's last character
        cut = len(decode(base.token_ids[:i]))
        stop = base.text[cut - 1: cut + 2]
        if base.text.startswith(decode(base.token_ids[:i])) and len(stop) == 3 and base.text.find(stop) == cut - 1:
            break
    else:
        pytest.fail("no token boundary to put a stop string across")
    outs = run(allm, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=stop))
    texts = [o.outputs[0].text for o in outs]
    assert texts[-1] == base.text[: cut - 1] and all(texts[-1].startswith(t) for t in texts)
    assert outs[-1].outputs[0].stop_reason == stop


def test_n_samples_are_cumulative_per_index(allm, ref):
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)
    want = ref.generate([PROMPT], params)[0].outputs
    outs = run(allm, params)
    assert all(sorted(o.index for o in out.outputs) == [0, 1, 2] for out in outs)  # every sample, in every output
    rows = per_index(outs)
    for w in want:
        assert_grows_to(rows[w.index], w)


def test_beam_rows_are_whole_hypotheses_and_deltas_are_refused(allm):
    beams = BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
    final = run(allm, beams, stream=False)
    outs = run(allm, beams)
    assert len(final) == 1 and len(outs) > 1
    assert all(len(out.outputs) == 2 for out in outs)
    assert [len(out.outputs[0].token_ids) for out in outs] == sorted(len(out.outputs[0].token_ids) for out in outs)
    assert [(o.text, o.token_ids) for o in outs[-1].outputs] == [(o.text, o.token_ids) for o in final[0].outputs]
    assert outs[-1].outputs[0].cumulative_logprob == final[0].outputs[0].cumulative_logprob is not None
    with pytest.raises(ValueError, match="beam search cannot stream deltas"):
        run(allm, beams, stream=True)
