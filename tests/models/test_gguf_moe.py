"""A Mixture-of-Experts model from a llama.cpp GGUF file (qwen3moe): config, weights and greedy tokens.

The file is written here from a random Qwen3-MoE checkpoint (tests/helpers/gguf_moe.py): the experts stacked one
tensor per layer and projection as llama.cpp stores them, the experts and the q, k and v weights in Q8_0, the rest F32.
transformers loads the same file as the oracle. It reads no `expert_feed_forward_length` for qwen3moe, so it is
handed the config nano_infer read (`gguf.complete_config` fills that field from the file).
"""
import pytest
import torch

from nano_infer import LLM, SamplingParams
from nano_infer.models.loader import load_config
from tests.helpers.gguf_moe import make_sparse_qwen3_moe, write_qwen3moe_gguf
from tests.helpers.parity import prompts

MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "hidden_size",
              "num_hidden_layers", "head_dim", "num_key_value_heads", "tie_word_embeddings")


@pytest.fixture(scope="module")
def files(tmp_path_factory, tokenizer):
    """(checkpoint's transformers model, GGUF path); what the engine saves of the file's reads goes to a temporary
    cache, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NANO_INFER_CACHE", str(tmp_path_factory.mktemp("cache")))
        _, model = make_sparse_qwen3_moe(tmp_path_factory.mktemp("qwen3_moe_ckpt"), tokenizer)
        path = write_qwen3moe_gguf(tmp_path_factory.mktemp("qwen3_moe_gguf") / "moe.Q8_0.gguf", model, tokenizer)
        yield model, path


@pytest.fixture(scope="module")
def llm(files):
    return LLM(str(files[1]), dtype="float32", block_size=4)


@pytest.fixture(scope="module")
def oracle(files, llm):
    from transformers import AutoModelForCausalLM

    path = files[1]
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, config=llm.engine.hf_config,
                                                dtype=torch.float32, attn_implementation="sdpa").eval()


def test_the_config_read_from_the_file_is_the_checkpoints(files):
    """transformers assumes norm_topk_prob=True for any qwen3moe file (llama.cpp always renormalises the top-k
    weights); the experts' width comes from the file, not Qwen3MoeConfig's default."""
    model, path = files
    config = load_config(path.parent, path.name)
    assert config.model_type == "qwen3_moe" and config.moe_intermediate_size != 768  # not the class default
    assert {f: getattr(config, f) for f in MOE_FIELDS} == {f: getattr(model.config, f) for f in MOE_FIELDS}
    assert config.rms_norm_eps == pytest.approx(model.config.rms_norm_eps)  # stored as a float32


def test_stacked_experts_and_router_load_as_transformers_reads_them(llm, oracle, files):
    """Every expert's gate, up and down, dequantized from Q8_0, and the router are transformers' float32 weights
    exactly; the Q8_0 experts differ from the checkpoint's by rounding only."""
    ours, theirs, checkpoint = llm.engine.model.state_dict(), oracle.state_dict(), files[0].state_dict()
    for layer in range(oracle.config.num_hidden_layers):
        for part in ("experts.gate_up_proj", "experts.down_proj", "gate.weight"):
            name = f"layers.{layer}.mlp.{part}"
            assert torch.equal(ours[name], theirs[f"model.{name}"]), name
            rounding = (ours[name] - checkpoint[f"model.{name}"]).abs().max()
            assert (rounding == 0) == (part == "gate.weight") and rounding < 0.01, (name, rounding)


def test_greedy_tokens_equal_transformers_on_the_file(llm, oracle, tokenizer):
    ps = prompts(tokenizer)[1:4]
    outs = llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(temperature=0, max_tokens=12,
                                                                              ignore_eos=True))
    with torch.no_grad():
        want = [oracle.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(p):].tolist() for p in ps]
    assert [o.outputs[0].token_ids for o in outs] == want
    assert len({t for w in want for t in w}) > 5  # the text varies: a broken expert would show


def test_as_stored_the_experts_are_dequantized_and_said_so(files):
    """No as-stored kernel runs a 3-D weight: in bfloat16 with quantization="gguf" the q, k and v weights run as
    stored (q, k and v fused), the experts are dequantized, and the startup line counts them."""
    llm = LLM(str(files[1]), dtype="bfloat16", quantization="gguf", block_size=4)
    held = llm.engine.model.weights_held
    assert "3 linear layers Q8_0" in held and "9 Q8_0 expert tensors dequantized" in held, held
    assert "int4 form" not in held, held  # Q8_0 has an exact form: the experts run in floats for being experts
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4


def test_parts_of_different_forms_are_fused_in_floats_and_the_router_is_dequantized(files, tmp_path, tokenizer):
    """Q4_0 attn_q and attn_k beside a Q8_0 attn_v (as a Q4_K_M file has Q6_K attn_v beside Q4_K q and k), and a
    Q4_0 router: as stored, the fused qkv weight is held in floats and so is the router (it is no linear layer the
    int4 kernel runs), and the tokens are those of the file dequantized whole."""
    types = {"_exps.": "Q8_0", "attn_q.": "Q4_0", "attn_k.": "Q4_0", "attn_v.": "Q8_0", "ffn_gate_inp.": "Q4_0"}
    path = write_qwen3moe_gguf(tmp_path / "mixed.gguf", files[0], tokenizer, types)
    stored = LLM(str(path), dtype="float32", quantization="gguf", block_size=4)
    held = stored.engine.model.weights_held
    assert "6 Q4_0 fused with another type tensors" in held and "3 Q8_0 fused with another type tensors" in held
    assert "3 Q4_0 router tensors" in held and "9 Q8_0 expert tensors" in held, held
    ps = [{"prompt_token_ids": p} for p in prompts(tokenizer)[:2]]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    whole = LLM(str(path), dtype="float32", block_size=4)
    assert [o.outputs[0].token_ids for o in stored.generate(ps, greedy)] == \
        [o.outputs[0].token_ids for o in whole.generate(ps, greedy)]


def test_a_gguf_architecture_without_a_config_reader_is_a_clear_error(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "olmoe.gguf"
    writer = GGUFWriter(str(path), "olmoe")
    writer.add_block_count(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="transformers reads no config from this GGUF file.*safetensors"):
        LLM(str(path))
