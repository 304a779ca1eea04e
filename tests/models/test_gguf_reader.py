"""The GGUF tensor table, read from files gguf's own writer made (no model needed)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=20, deadline=None)
@given(alignment=st.sampled_from([8, 32, 64]), words=st.lists(st.text(max_size=6), max_size=30),
       kinds=st.lists(st.sampled_from(["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K"]), min_size=1, max_size=5),
       rows=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_the_tensor_table_reads_as_ggufs_own_reader_reads_it(tmp_path_factory, alignment, words, kinds, rows, seed):
    """Files written by gguf's GGUFWriter (string arrays, numbers, any alignment, float and block types):
    read_gguf_tensors finds every tensor where GGUFReader does, with the same type, shape and bytes."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

    from nano_infer.models.gguf import read_gguf_tensors

    path = tmp_path_factory.mktemp("gguf") / "t.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(alignment)
    writer.add_array("tokenizer.ggml.tokens", words or ["a"])
    writer.add_array("llama.rope.sections", [1, 2, 3])
    writer.add_float32("llama.rope.freq_base", 1e4)
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, 256)).astype(np.float32)
    for i, kind in enumerate(kinds):
        qtype = GGMLQuantizationType[kind]
        block, block_bytes = GGML_QUANT_SIZES[qtype]  # any bytes make blocks: the reader only places them
        blocks = rng.integers(0, 256, (rows, 256 // block * block_bytes), dtype=np.uint8)
        data = values.astype(np.float16) if kind == "F16" else values if kind == "F32" else blocks
        writer.add_tensor(f"t{i}", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    theirs = GGUFReader(str(path)).tensors
    ours = read_gguf_tensors(path)
    assert [(t.name, t.tensor_type) for t in ours] == [(t.name, t.tensor_type) for t in theirs]
    for a, b in zip(ours, theirs):
        assert a.data.shape == b.data.shape and a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
