"""table_text: a frame wider than a notebook's output area in blocks of columns that fit, each naming its rows."""
import pandas as pd

from nano_infer.viz import TEXT_COLUMNS, table_text


def test_a_frame_that_fits_is_pandas_own_text():
    frame = pd.DataFrame({"k": [4, 8], "ms": [3.3, 4.0]})
    assert table_text(frame) == frame.to_string(index=False)


def test_a_wide_frame_splits_into_blocks_that_fit_and_repeat_the_key_column():
    frame = pd.DataFrame({"prefix tokens": [16, 1024], **{f"a long column name {i}": [1.5, 2.25] for i in range(8)}})
    assert max(map(len, frame.to_string(index=False).splitlines())) > TEXT_COLUMNS
    blocks = table_text(frame).split("\n\n")
    assert len(blocks) > 1
    for block in blocks:
        lines = block.splitlines()
        assert len(lines) == 3 and max(map(len, lines)) <= TEXT_COLUMNS
        assert lines[0].split()[:2] == ["prefix", "tokens"] and lines[2].split()[0] == "1024"
    assert sum(block.splitlines()[0].count("a long column name") for block in blocks) == 8  # every column, once


def test_keep_repeats_several_columns_and_width_is_a_parameter():
    frame = pd.DataFrame({"mode": ["swap"], "run": [1], **{f"column {i}": [i] for i in range(6)}})
    blocks = table_text(frame, width=30, keep=2).split("\n\n")
    assert len(blocks) > 1 and all(b.splitlines()[0].split()[:2] == ["mode", "run"] for b in blocks)
