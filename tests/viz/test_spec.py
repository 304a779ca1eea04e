"""Chapter 09's pass-by-pass grid draws what was emitted, and says what each colour means."""
from nano_infer.viz.spec import LEGEND, STATUS, spec_steps_figure


class Tok:
    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


# (request, index, length before, proposal, tokens appended, proposals accepted)
LOG = [("r", 0, 10, [1, 2, 3], [1, 9], 1),  # second proposal rejected: the target corrects it with 9
       ("r", 0, 12, [4, 5], [4, 5, 6], 2),  # all accepted: a bonus token 6
       ("r", 0, 15, [7, 0, 8], [7, 0], 3)]  # 0 (an end of turn) accepted ends the request: 8 and the bonus never came


def test_cells_follow_what_was_accepted_and_emitted():
    z = spec_steps_figure(LOG, Tok()).data[0].z
    s = STATUS
    assert [list(row) for row in z] == [[s["accepted"], s["rejected"], s["rejected"], s["corrected"]],
                                        [s["accepted"], s["accepted"], 0, s["bonus"]],
                                        [s["accepted"], s["accepted"], s["not emitted"], 0]]
    assert spec_steps_figure(LOG, Tok()).data[0].text[2][-1] == ""  # no target token after the end


def test_every_colour_has_a_legend_entry_and_frames_keep_it():
    fig = spec_steps_figure(LOG, Tok())
    assert {t.name for t in fig.data[1:]} == set(LEGEND.values()) and all(t.showlegend is not False for t in fig.data[1:])
    assert all(list(f.traces) == [0] for f in fig.frames)
    assert "7 tokens in 3 passes; 6/8 proposals accepted" in fig.layout.title.text
