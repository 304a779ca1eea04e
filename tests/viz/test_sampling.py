"""The sampling picture shows the distribution the engine's sampler draws from."""
import pytest
import torch

from nano_infer.viz.sampling import next_token_figure, sampling_distribution, sampling_widget

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


class ByteTokenizer:
    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def test_greedy_and_top_k_one_are_one_hot():
    for probs in (sampling_distribution(LOGITS, temperature=0), sampling_distribution(LOGITS, top_k=1)):
        assert probs.tolist() == [1.0, 0, 0, 0, 0, 0]


def test_top_k_renormalises_over_the_kept_tokens():
    probs = sampling_distribution(LOGITS, temperature=0.5, top_k=3)
    expected = (LOGITS[:3] / 0.5).softmax(-1)
    assert torch.allclose(probs[:3], expected) and probs[3:].sum() == 0


def test_top_p_keeps_the_smallest_set_reaching_p():
    p = LOGITS.softmax(-1)
    top_p = float(p[:2].sum()) - 1e-3  # the first two tokens cover top_p only together
    probs = sampling_distribution(LOGITS, top_p=top_p)
    assert (probs > 0).tolist() == [True, True, False, False, False, False]


def test_figure_bars_compare_softmax_and_sampler():
    fig = next_token_figure(LOGITS, ByteTokenizer(), temperature=1.0, top_k=2, num_tokens=4)
    raw, kept = fig.data
    assert list(raw.x) == ["0: 'a'", "1: 'b'", "2: 'c'", "3: 'd'"]
    assert list(raw.y) == pytest.approx(LOGITS.softmax(-1)[:4].tolist())
    assert list(kept.y) == pytest.approx(LOGITS[:2].softmax(-1).tolist() + [0, 0])
    assert "2 of 6 tokens" in fig.layout.title.text


def test_title_prints_settings_without_float_noise():
    fig = next_token_figure(LOGITS, ByteTokenizer(), temperature=0.1 * 3, top_p=0.1 + 0.2 + 0.3, num_tokens=4)
    assert fig.layout.title.text.startswith("T=0.3, top_k=off, top_p=0.6:")  # as the slider says: 0 = off


def test_widget_recomputes_the_figure_in_place():
    box = sampling_widget(LOGITS, ByteTokenizer(), num_tokens=4)
    temperature, top_k, top_p = box.children[0].children
    fig = box.children[1]
    assert list(fig.data[1].y) == pytest.approx(LOGITS.softmax(-1)[:4].tolist())
    top_k.value = 1
    assert list(fig.data[1].y) == [1.0, 0, 0, 0]
    assert "1 of 6 tokens" in fig.layout.title.text
