"""Deltas: what a stream sends of each cumulative output, holding back text a stop string may still claim."""
from nano_infer import CompletionOutput, RequestOutput, SamplingParams
from nano_infer.async_engine.streams import Deltas


def test_deltas_hold_back_a_possible_stop_string():
    deltas = Deltas(SamplingParams(stop=["wor"]))

    def cumulative(text, tokens, reason=None):
        return RequestOutput("r", None, [1], [CompletionOutput(0, text, tokens, reason)], reason is not None)

    sent = [deltas.next(cumulative("He", [1])), deltas.next(cumulative("Hello w", [1, 2])),
            deltas.next(cumulative("Hello w", [1, 2])), deltas.next(cumulative("Hello wo", [1, 2, 3])),
            deltas.next(cumulative("Hello ", [1, 2, 3, 4], "stop"))]
    assert [o.outputs[0].text if o else None for o in sent] == ["", "Hello", None, " ", ""]
    assert [o.outputs[0].token_ids if o else None for o in sent] == [[1], [2], None, [3], [4]]
    assert sent[-1].finished and sent[-1].outputs[0].finish_reason == "stop"


def test_so_far_is_what_was_released_whole_and_holds_back_the_same_text():
    """CUMULATIVE outputs (Deltas.so_far): every sample's text up to what its deltas reached, token ids and logprobs
    whole, so each output's text extends the one before even when a stop string is cut off at the end."""
    deltas = Deltas(SamplingParams(n=2, stop=["wor"]))

    def cumulative(texts, tokens, reasons=(None, None)):
        return RequestOutput("r", None, [1], [CompletionOutput(i, t, tokens, r, logprobs=[{}] * len(tokens))
                                              for i, (t, r) in enumerate(zip(texts, reasons))], all(reasons))

    sent = []
    for out in [cumulative(("He", "Hi"), [1]), cumulative(("Hello w", "Hi there"), [1, 2]),
                cumulative(("Hello wo", "Hi there"), [1, 2, 3], (None, "length")),
                cumulative(("Hello ", "Hi there"), [1, 2, 3, 4], ("stop", "length"))]:
        assert deltas.next(out) is not None
        sent.append(deltas.so_far(out))
    assert [[o.text for o in out.outputs] for out in sent] == [["", ""], ["Hello", "Hi the"], ["Hello ", "Hi there"],
                                                              ["Hello ", "Hi there"]]
    assert all(len(o.token_ids) == len(o.logprobs) == i + 1 for i, out in enumerate(sent) for o in out.outputs)
    assert [out.finished for out in sent] == [False, False, False, True]
