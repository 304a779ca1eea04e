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
