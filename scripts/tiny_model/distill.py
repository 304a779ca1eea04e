"""Distil a draft model from the target: a copy of the target's first layers, trained to match
the target's next-token distribution (KL divergence on assistant tokens).

Speculative decoding accepts a drafted token with probability min(1, p/q), so the expected
acceptance per token is 1 - TV(p, q): the draft should imitate the target, not the data. The
loss is therefore KL(p_target || q_draft), not cross-entropy against the corpus.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Qwen2ForCausalLM

from . import train as tr


def truncated_copy(target: Qwen2ForCausalLM, layers: int) -> Qwen2ForCausalLM:
    """A target with only its first `layers` decoder layers: same embeddings, norm and head."""
    config = target.config.__class__(**target.config.to_dict())
    config.num_hidden_layers = layers
    config.layer_types = config.layer_types[:layers]
    draft = Qwen2ForCausalLM(config).float()
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    draft.load_state_dict(state, strict=False)
    draft.tie_weights()
    return draft


def masked_logits(model, ids, mask):
    """Logits of the masked positions only: the [tokens, vocab] head is most of the cost at this size."""
    hidden = model.model(input_ids=ids).last_hidden_state
    return model.lm_head(hidden[mask.bool()]).float()


def kl_loss(draft_logits, target_logits):
    """Mean over positions of KL(p_target || q_draft)."""
    logq = F.log_softmax(draft_logits, -1)
    logp = F.log_softmax(target_logits, -1)
    return F.kl_div(logq, logp, log_target=True, reduction="batchmean")


def distill(draft, target, stream, steps: int, lr: float, warmup: int, log_every: int = 50) -> dict:
    """The tied embedding/head stays the target's (frozen): only the layer(s) and the final norm
    learn, which halves the backward pass and keeps the draft's output space the target's."""
    draft.model.embed_tokens.weight.requires_grad_(False)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    draft.train()
    target.eval()
    t0, ema, tokens, history = time.time(), None, 0, []
    bar = tqdm(range(steps), desc="distil", mininterval=2.0)
    for step in bar:
        ids, mask = next(stream)
        for g in opt.param_groups:
            g["lr"] = tr.cosine_lr(step, steps, lr, warmup)
        with torch.no_grad():
            t_logits = masked_logits(target, ids, mask)
        loss = kl_loss(masked_logits(draft, ids, mask), t_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        tokens += ids.numel()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        bar.set_postfix(kl=f"{ema:.3f}")
        if (step + 1) % log_every == 0 or step + 1 == steps:
            history.append({"step": step + 1, "kl": round(ema, 4), "seconds": round(time.time() - t0, 1)})
    return {"train_seconds": time.time() - t0, "tokens_seen": tokens, "history": history}


@torch.no_grad()
def agreement(draft, target, examples, limit: int = 32) -> dict:
    """On assistant tokens of held-out conversations: how often the draft's argmax equals the
    target's (greedy acceptance per token) and the mean of 1 - TV(p, q) (acceptance per token
    when sampling at temperature 1)."""
    draft.eval()
    target.eval()
    same = accept = n = 0.0
    kl = 0.0
    for ids, mask in examples[:limit]:
        x = torch.tensor([ids])
        m = torch.tensor(mask).bool()
        p = F.softmax(target(input_ids=x).logits[0, m], -1)
        dl = draft(input_ids=x).logits[0, m]
        q = F.softmax(dl, -1)
        same += (p.argmax(-1) == q.argmax(-1)).sum().item()
        accept += torch.minimum(p, q).sum(-1).sum().item()
        kl += (p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-30).log())).sum().item()
        n += int(m.sum())
    return {"greedy_agreement": same / n, "sampled_acceptance": accept / n, "kl": kl / n, "tokens": int(n),
            "conversations": min(limit, len(examples))}
