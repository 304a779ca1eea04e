"""IncrementalDetokenizer: streamed text never splits a character, whatever the tokens' byte boundaries."""
from nano_infer.text.byte_level import gpt2_unicode_to_byte
from nano_infer.text.detokenizer import IncrementalDetokenizer


def test_incremental_detokenizer_never_splits_a_character(tokenizer):
    to_byte_token = {b: tokenizer.convert_tokens_to_ids(c) for c, b in gpt2_unicode_to_byte().items()}
    for text in ["To be, or not to be", "你好，世界！", "🙂🚀 café naïve", "mixed 你好 🙂 end"]:
        merged = tokenizer.encode(text, add_special_tokens=False)
        one_byte_each = [to_byte_token[b] for b in text.encode("utf-8")]
        for ids in (merged, one_byte_each):
            detok = IncrementalDetokenizer(tokenizer)
            deltas = [detok.add(t) for t in ids] + [detok.flush()]
            assert all("\ufffd" not in d for d in deltas)
            assert "".join(deltas) == text == tokenizer.decode(ids)
        if text != text.encode("ascii", "ignore").decode():
            assert len(one_byte_each) > len(text)  # characters really were split across tokens
