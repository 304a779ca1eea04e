"""Chapter 11's stepper reads one way: it fits a 1280 px window, counts in rounds as its slider does,
says block ids as ids, and draws every finished hypothesis inside the rows of the beams."""
from nano_infer.kv.block_manager import BlockEvent
from nano_infer.viz import OUTPUT_WIDTH
from nano_infer.viz.beams import BeamRound, BeamView, Finished, beam_stepper


def _rounds():
    r1 = BeamRound(step=3, round=1, beams=[BeamView(1, 1, 0, [5], -1.0, [0]), BeamView(2, 1, 1, [6], -2.0, [0])],
                   finished=[], ref_counts=[2, 0, 0, 0], num_free_blocks=3, forks=[(1, 2)])
    # round 2: the rank-1 beam (seq 2, the bottom row) ends with a finished hypothesis and is pruned
    r2 = BeamRound(step=4, round=2, beams=[BeamView(1, 1, 0, [5, 7], -1.5, [0, 1]), BeamView(3, 1, 1, [5, 8], -2.5, [0, 10])],
                   finished=[Finished([6, 9], -1.1, "stop", 2)], ref_counts=[2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                   num_free_blocks=1, forks=[(1, 3)], pruned=[2],
                   events=[BlockEvent("free", 2, 10, 0, 2), BlockEvent("alloc", 3, 10, 1, 1)])
    done = BeamRound(step=5, round=3, beams=[], finished=[Finished([6, 9], -1.1, "stop", None)],
                     ref_counts=[0] * 11, num_free_blocks=11, done=True)
    return [r1, r2, done]


def test_the_figure_fits_jupyterlabs_output_area_and_keeps_its_colour_bar_title():
    fig = beam_stepper(_rounds())
    assert fig.layout.width <= OUTPUT_WIDTH
    heat = next(t for t in fig.data if t.type == "heatmap")
    title = heat.colorbar.title.text
    assert "ref" in title and "count" in title and heat.colorbar.title.side == "top"  # above the bar, not cut at the edge
    assert fig.layout.margin.r >= 60


def test_frames_count_rounds_as_the_slider_does_and_name_blocks_as_ids():
    fig = beam_stepper(_rounds())
    titles = [f.layout.title.text for f in fig.frames]
    labels = [s.label for s in fig.layout.sliders[0].steps]
    assert labels == ["1", "2", "3 (done)"]
    for title, label in zip(titles, labels):
        assert title.startswith(f"round {label.split()[0]}:") and "step" not in title
    assert "back to the free list: block 10" in titles[1]


def test_every_finished_star_sits_in_the_row_of_its_beam():
    fig = beam_stepper(_rounds())
    width = 2
    for frame in fig.frames:
        stars = next(t for t in frame.data if t.type == "scatter" and t.marker.symbol == "star")
        ys = [y for y in stars.y if y is not None]
        assert all(y in range(width) for y in ys), ys  # on a row, never below the last one
    last = next(t for t in fig.frames[-1].data if t.type == "scatter" and t.marker.symbol == "star")
    assert list(last.y) == [1] and list(last.x) == [1.5]  # the bottom row's beam, between rounds 1 and 2
