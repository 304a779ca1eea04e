"""The DFA picture: edge labels, layout, a walk that follows each token's bytes, the highlighted path."""
import pytest

from nano_infer.constrained import ByteDFA, TokenIndex, TokenVocabulary
from nano_infer.viz.dfa import HIGHLIGHT, bytes_label, dfa_figure, dfa_stepper, layout, spell, walk

# 北 is E5 8C 97: one token holds its first byte, another the other two, a third all three.
TOKENS = [b"a", b"b", b"ab", b"c", b"\xe5", b"\x8c\x97", b"\xe5\x8c\x97", b"x", None]
EOS = 8
A, B, AB, C, LEAD, REST, BEI, X = range(8)


@pytest.fixture(scope="module")
def machine():
    vocab = TokenVocabulary(list(TOKENS), {EOS})
    dfa = ByteDFA.from_regex("(北|ab)c")
    return dfa, TokenIndex.build(dfa, vocab)


def test_bytes_label_writes_ranges_ascii_and_hex():
    assert bytes_label(range(0x30, 0x3A)) == "0-9"
    assert bytes_label([0xE5]) == "E5"
    assert bytes_label(range(0x80, 0xC0)) == "80-BF"
    assert bytes_label([0x20, 0x61, 0x62]) == "' ',a-b"
    assert bytes_label([1, 3, 5, 7, 9]) == "01,03,… (5 bytes)"


def test_spell_shows_text_or_raw_bytes():
    assert spell("北".encode()) == "'北'"
    assert spell(b"\xe5") == r"b'\xe5'"
    assert spell(None) == "(special)"


def test_layout_puts_each_state_at_its_distance_from_the_start():
    dfa = ByteDFA.from_regex("abc")
    pos = layout(dfa)
    for n, prefix in enumerate([b"", b"a", b"ab", b"abc"]):
        assert pos[dfa.walk(prefix), 0] == n


def test_walk_follows_every_byte_of_every_token(machine):
    dfa, index = machine
    steps = walk(index, dfa, [LEAD, REST, C])
    assert [s.token_id for s in steps] == [LEAD, REST, C, None]
    assert steps[1].state == dfa.walk(b"\xe5")
    assert steps[2].byte_states == [dfa.walk(b"\xe5\x8c\x97"), dfa.walk(b"\xe5\x8c\x97c")]
    assert steps[1].byte_states == [dfa.walk(b"\xe5"), dfa.walk(b"\xe5\x8c"), dfa.walk(b"\xe5\x8c\x97")]
    assert sorted(steps[0].allowed.tolist()) == [A, AB, LEAD, BEI]  # "b", "c", the tail of 北 and "x" cannot start
    assert sorted(steps[1].allowed.tolist()) == [REST]  # inside 北: only its last two bytes
    assert not steps[2].eos_allowed and steps[3].eos_allowed and len(steps[3].allowed) == 0


def test_walk_refuses_a_token_the_index_does_not_allow(machine):
    dfa, index = machine
    with pytest.raises(ValueError, match="not allowed"):
        walk(index, dfa, [LEAD, C])


def test_figure_highlights_the_token_path_and_lists_the_state_row(machine):
    dfa, index = machine
    steps = walk(index, dfa, [BEI, C])
    fig = dfa_figure(dfa, index, steps[0], "test")
    pos = layout(dfa)
    hot = [(a.ax, a.ay, a.x, a.y) for a in fig.layout.annotations if a.arrowcolor == HIGHLIGHT]
    path = steps[0].byte_states
    assert len(path) == 4  # the three bytes of 北
    assert sorted(hot) == sorted((*pos[s], *pos[t]) for s, t in zip(path, path[1:]))
    nodes = [t for t in fig.data if t.type == "scatter" and t.mode == "markers+text"]
    assert len(nodes) == 1 and len(nodes[0].x) == dfa.num_states
    table = next(t for t in fig.data if t.type == "table")
    ids, spelled, leads_to = table.cells.values
    assert ids[0] == str(BEI) and spelled[0] == "'北'" and leads_to[0] == str(steps[1].state)
    assert sorted(map(int, ids)) == [A, AB, LEAD, BEI]
    end = dfa_figure(dfa, index, steps[-1])
    assert list(next(t for t in end.data if t.type == "table").cells.values[0]) == ["EOS"]


def test_stepper_has_a_frame_per_token_read(machine):
    dfa, index = machine
    steps = walk(index, dfa, [LEAD, REST, C])
    fig = dfa_stepper(dfa, index, steps, "北c")
    assert len(fig.frames) == len(steps)
    hot = [sum(a.arrowcolor == HIGHLIGHT for a in f.layout.annotations) for f in fig.frames]
    assert hot == [len(s.byte_states) - 1 for s in steps]  # each frame lights up its own token's bytes
