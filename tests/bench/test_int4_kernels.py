"""The few-row kernel table (bench/int4_kernels.py): every form it times multiplies by the same weight."""
from nano_infer.bench import int4_kernels


def test_every_form_computes_the_int4_weights_product(monkeypatch):
    monkeypatch.setattr(int4_kernels, "CACHE_BYTES", 1 << 16)  # a few small matrices: the numbers, not the speed
    table = int4_kernels.time_shape(128, 96, rows=[1, 3], rounds=1)
    assert {"int4", "int8 weight-only", "int8 x int8"} <= set(table)
    for form, by_rows in table.items():
        assert set(by_rows) == {1, 3}
        assert all(t["us"] > 0 and t["gmacs"] > 0 for t in by_rows.values())
        # bfloat16 outputs round at 2^-8; 8-bit weights or rows add their own step of 1/127 of the largest value
        bound = 0.01 if form in ("int4", "bfloat16") else 0.04
        assert max(t["error"] for t in by_rows.values()) <= bound, (form, by_rows)


def test_a_form_that_multiplies_by_another_weight_shows_its_error(monkeypatch):
    monkeypatch.setattr(int4_kernels, "CACHE_BYTES", 1 << 16)
    right = int4_kernels.forms

    def with_its_rows_out_of_order(w4):
        table, w = right(w4)
        multiply, (q8, scale) = table["int8 weight-only"]
        table["int8 weight-only"] = (multiply, (q8.flip(0).contiguous(), scale))  # rows in the wrong order
        return table, w

    monkeypatch.setattr(int4_kernels, "forms", with_its_rows_out_of_order)
    table = int4_kernels.time_shape(128, 96, rows=[1], rounds=1)
    assert table["int8 weight-only"][1]["error"] > 0.3
    assert table["int4"][1]["error"] <= 0.01
