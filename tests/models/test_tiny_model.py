"""The tiny chat model shipped in nano_infer/models/tiny (built by scripts/make_tiny_model.py).

Checks that it loads offline with transformers, that nano_infer renders the same chat ids as
the chat template, that nano_infer's greedy output equals transformers generate(), that the
held-out loss recorded in eval.json is what the weights give on heldout_sample.jsonl, and that
the model is really trained (far below a unigram model).
"""
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.helpers.checkpoints import MESSAGES, TINY  # noqa: E402

FILES = ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
         "tokenizer_config.json", "README.md", "eval.json", "heldout_sample.jsonl"]
REL_TOL = 1e-3   # eval.json's sample loss vs. recomputed here (float32 summation order only)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TINY, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(TINY, local_files_only=True, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    return tok, model


@pytest.fixture(scope="module")
def record():
    return json.loads((TINY / "eval.json").read_text())


@pytest.fixture(scope="module")
def llm():
    from nano_infer import LLM
    return LLM(str(TINY), dtype="float32")


def test_shipped_files_load_offline(hf):
    tok, model = hf
    for name in FILES:
        assert (TINY / name).is_file(), name
    assert (TINY / "model.safetensors").stat().st_size <= 16 * 1024 * 1024
    assert (TINY / "heldout_sample.jsonl").stat().st_size <= 100 * 1024
    cfg = model.config
    assert cfg.architectures == ["Qwen2ForCausalLM"]
    assert cfg.num_key_value_heads < cfg.num_attention_heads          # GQA
    assert cfg.tie_word_embeddings
    assert cfg.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = "O, that this too too solid flesh would melt,\n  Thaw and resolve itself into a dew! ’tis 1601 é"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in MESSAGES) \
        + "<|im_start|>assistant\n"


def test_chat_ids_equal_chat_template(hf, llm):
    from nano_infer import SamplingParams
    tok, _ = hf
    out = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=8))
    expected = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert out[0].prompt_token_ids == list(expected)


def test_greedy_matches_transformers_generate(hf, llm):
    from nano_infer import SamplingParams
    tok, model = hf
    chats = [MESSAGES,
             [{"role": "system", "content": "You are JULIET in Romeo and Juliet. Stay in character and answer in Shakespeare's words."},
              {"role": "user", "content": "ROMEO: Lady, by yonder blessed moon I swear."}],
             [{"role": "system", "content": "You are PROSPERO in The Tempest. Stay in character and answer in Shakespeare's words."},
              {"role": "user", "content": "MIRANDA: Father, why did you raise this storm?"},
              {"role": "assistant", "content": "Be collected:\nNo more amazement."},
              {"role": "user", "content": "MIRANDA: O, woe the day!"}]]
    prompts = [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False))
               for c in chats]
    outs = llm.generate(prompt_token_ids=prompts,
                        sampling_params=SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                 eos_token_id=None, pad_token_id=tok.pad_token_id)
        assert out.outputs[0].token_ids == ref[0, len(ids):].tolist()


def _assistant_mask(tok, messages):
    """Ids from the chat template, and 1 on the tokens that carry loss: each assistant reply's
    words and its closing <|im_end|> (not the role header, not the newline after <|im_end|>)."""
    text, spans, pos = "", [], 0
    for m in messages:
        head, body = f"<|im_start|>{m['role']}\n", m["content"] + "<|im_end|>"
        if m["role"] == "assistant":
            spans.append((pos + len(head), pos + len(head) + len(body)))
        text += head + body + "\n"
        pos = len(text)
    assert text == tok.apply_chat_template(messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    assert ids == list(tok.apply_chat_template(messages, tokenize=True, return_dict=False))
    mask = [int(any(a <= start < b for a, b in spans)) for start, _ in enc["offset_mapping"]]
    return ids, mask


def test_heldout_loss_matches_eval_json(hf, record):
    tok, model = hf
    total, count = 0.0, 0
    with torch.no_grad():
        for line in (TINY / "heldout_sample.jsonl").read_text(encoding="utf-8").splitlines():
            ids, mask = _assistant_mask(tok, json.loads(line)["messages"])
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits[0, :-1].float()
            m = torch.tensor(mask[1:]).bool()
            total += F.cross_entropy(logits[m], x[0, 1:][m], reduction="sum").item()
            count += int(m.sum())
    assert count > 1000
    assert total / count == pytest.approx(record["heldout_sample_loss"], rel=REL_TOL)


def test_model_is_trained(record):
    unigram = record["unigram_heldout_loss"]
    assert record["heldout_sample_loss"] < 0.7 * unigram
    assert record["heldout_loss"] < 0.7 * unigram
    assert record["train_loss"] < record["heldout_loss"] + 0.5
    assert record["params"] <= 4_200_000
