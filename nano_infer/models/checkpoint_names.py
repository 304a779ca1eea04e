"""How a checkpoint's tensor names map onto the model's fused weights.

q/k/v and gate/up are read as separate tensors and held as one matmul each (`qkv_proj`, `gate_up_proj`),
and a Mixture-of-Experts layer's experts, stored one tensor per expert and part, as two stacked weights a
layer (models/moe.py). Mixtral spells its experts' parts differently; `canonical` renames them first, so one
table serves every family.
"""
from __future__ import annotations

import re

import torch

# one expert's weight in a checkpoint: layers.L.mlp.experts.E.{gate,up,down}_proj.weight
# Mixtral's names for the same parts: block_sparse_moe for mlp, w1 / w3 / w2 for gate / up / down
_MIXTRAL = {".block_sparse_moe.": ".mlp.", ".w1.": ".gate_proj.", ".w3.": ".up_proj.", ".w2.": ".down_proj."}
_EXPERT = re.compile(r"(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")


def canonical(hf_name: str) -> str:
    """A checkpoint tensor's name as Qwen3-MoE spells it: Mixtral's experts and router renamed, all else as it is."""
    if ".block_sparse_moe." not in hf_name:
        return hf_name
    for old, new in _MIXTRAL.items():
        hf_name = hf_name.replace(old, new)
    return hf_name


def whole(name: str, parts: list):
    """A fused weight from its parts: rows end to end, or for experts one [gate; up] (or down) per expert, stacked."""
    if name.endswith("experts.gate_up_proj"):
        return torch.stack([torch.cat(parts[i:i + 2]) for i in range(0, len(parts), 2)])
    if name.endswith("experts.down_proj"):
        return torch.stack(parts)
    return torch.cat(parts, dim=0) if isinstance(parts[0], torch.Tensor) else type(parts[0]).cat(parts)


def fused_name(name: str, experts: tuple[int, int] = (0, 0)) -> tuple[str, int | None, int]:
    """HF tensor name -> (our name, index of the part it fills in a fused weight or None, number of parts).
    `experts` = (first, count) of the experts this model holds: expert E's gate and up fill parts 2E and
    2E + 1 of the layer's stacked `gate_up_proj`, its down part E of `down_proj`."""
    name = name.removeprefix("model.")
    if m := _EXPERT.fullmatch(name):
        e = int(m[2]) - experts[0]
        if m[3] == "down":
            return f"{m[1]}.down_proj", e, experts[1]
        return f"{m[1]}.gate_up_proj", 2 * e + (m[3] == "up"), 2 * experts[1]
    for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
        if f".{part}." in name:
            return name.replace(part, "qkv_proj"), i, 3
    for i, part in enumerate(("gate_proj", "up_proj")):
        if f".{part}." in name:
            return name.replace(part, "gate_up_proj"), i, 2
    return name, None, 1
