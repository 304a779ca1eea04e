"""The Qwen2 model, the training loop and the evaluation (assistant-token loss)."""
from __future__ import annotations

import math
import random
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Qwen2Config, Qwen2ForCausalLM


def make_config(vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int,
                intermediate: int, max_positions: int, eos_id: int, pad_id: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, rope_theta=10000.0, rms_norm_eps=1e-6,
        hidden_act="silu", tie_word_embeddings=True, use_sliding_window=False,
        attention_dropout=0.0, initializer_range=0.02,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
        torch_dtype="float32", architectures=["Qwen2ForCausalLM"],
    )


def build_model(config: Qwen2Config, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    return model.float()


def masked_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of next-token cross-entropy over positions whose *target* has mask 1, and the count."""
    logits = logits[:, :-1].float()
    target = ids[:, 1:]
    m = mask[:, 1:].bool()
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
    ce = ce.view_as(target)[m]
    return ce.sum(), m.sum()


def cosine_lr(step: int, steps: int, lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def batches(examples, pack_fn, batch_size: int, seed: int):
    """Endless deterministic stream of (ids, mask) batches: re-pack with a new shuffle each epoch."""
    epoch = 0
    while True:
        rows = pack_fn(examples, seed + epoch)
        order = list(range(len(rows)))
        random.Random(seed + 1000 + epoch).shuffle(order)
        for i in range(0, len(order) - batch_size + 1, batch_size):
            chunk = [rows[j] for j in order[i:i + batch_size]]
            yield (torch.tensor([c[0] for c in chunk]), torch.tensor([c[1] for c in chunk]))
        epoch += 1


def train(model, stream, steps: int, lr: float, warmup: int, weight_decay: float = 0.1,
          log_every: int = 50, desc: str = "train") -> dict:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    model.train()
    t0 = time.time()
    history, ema, tokens = [], None, 0
    recent = []
    bar = tqdm(range(steps), desc=desc, mininterval=2.0)
    for step in bar:
        ids, mask = next(stream)
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, lr, warmup)
        logits = model(input_ids=ids).logits
        s, n = masked_loss(logits, ids, mask)
        loss = s / n.clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += ids.numel()
        v = loss.item()
        recent.append((s.item(), n.item()))
        ema = v if ema is None else 0.98 * ema + 0.02 * v
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{tokens / (time.time() - t0):.0f}")
        if (step + 1) % log_every == 0 or step + 1 == steps:
            history.append({"step": step + 1, "loss": round(ema, 4), "seconds": round(time.time() - t0, 1)})
    last = recent[-max(1, min(200, len(recent))):]   # train loss: assistant-token mean over the last 200 steps
    return {"train_loss": sum(a for a, _ in last) / max(1, sum(b for _, b in last)),
            "train_seconds": time.time() - t0, "tokens_seen": tokens,
            "tokens_per_second": tokens / (time.time() - t0), "history": history}


@torch.no_grad()
def eval_loss(model, examples) -> float:
    """Assistant-token loss, micro-averaged, each conversation run alone (no padding, no packing)."""
    model.eval()
    total, count = 0.0, 0
    for ids, mask in examples:
        x = torch.tensor([ids])
        s, n = masked_loss(model(input_ids=x).logits, x, torch.tensor([mask]))
        total += s.item()
        count += n.item()
    return total / max(1, count)


def unigram_loss(train_examples, eval_examples, vocab_size: int) -> float:
    """Cross-entropy of an add-one unigram model of assistant tokens (train) on eval assistant tokens."""
    counts = torch.ones(vocab_size, dtype=torch.float64)
    for ids, mask in train_examples:
        t = torch.tensor(ids[1:])[torch.tensor(mask[1:]).bool()]
        counts += torch.bincount(t, minlength=vocab_size).double()
    logp = (counts / counts.sum()).log()
    total, count = 0.0, 0
    for ids, mask in eval_examples:
        t = torch.tensor(ids[1:])[torch.tensor(mask[1:]).bool()]
        total += -logp[t].sum().item()
        count += t.numel()
    return total / max(1, count)


@torch.no_grad()
def eval_loss_batched(model, examples, pad_id: int, batch_size: int = 16) -> float:
    """Same quantity as eval_loss, faster: right-padded batches (causal attention, so the padding
    after a conversation cannot change its logits; only float rounding differs)."""
    model.eval()
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    total, count = 0.0, 0
    for k in range(0, len(order), batch_size):
        chunk = [examples[i] for i in order[k:k + batch_size]]
        n = max(len(ids) for ids, _ in chunk)
        ids = torch.tensor([i + [pad_id] * (n - len(i)) for i, _ in chunk])
        mask = torch.tensor([m + [0] * (n - len(m)) for _, m in chunk])
        s, c = masked_loss(model(input_ids=ids).logits, ids, mask)
        total += s.item()
        count += c.item()
    return total / max(1, count)
