"""The default KV pool on a CPU: sized from free memory, capped, and committed only as it fills."""
from types import SimpleNamespace

import psutil
import pytest
import torch

from nano_infer import LLMEngine
from nano_infer.kv.sizing import CPU_KV_AVAILABLE_FRACTION, CPU_KV_BUDGET
from nano_infer.kv.paged import KVPool


@pytest.mark.parametrize("available", [2**30, 64 * 2**30])
def test_cpu_budget_is_a_share_of_free_memory_capped_at_4_gib(monkeypatch, qwen2_dir, available):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=available))
    # max_num_seqs x max_model_len caps the pool too; make that cap far above both budgets
    engine = LLMEngine(str(qwen2_dir), dtype="float32", max_num_seqs=100_000, block_size=16, device="cpu")
    budget = min(CPU_KV_BUDGET, int(available * CPU_KV_AVAILABLE_FRACTION))
    assert engine.kv.num_blocks == budget // (engine.kv_bytes_per_token * 16)
    assert engine.kv_pool.nbytes <= budget and f"= {engine.kv.num_blocks * 16:,} tokens" in engine.startup_line


def test_pool_never_exceeds_what_max_num_seqs_full_sequences_use(qwen2_dir):
    engine = LLMEngine(str(qwen2_dir), dtype="float32", max_num_seqs=3, block_size=16, max_model_len=100, device="cpu")
    assert engine.kv.num_blocks == 3 * 7 + 1


def test_contiguous_cache_fits_full_length_sequences_in_the_budget(monkeypatch, qwen2_dir):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=64 * 2**30))
    engine = LLMEngine(str(qwen2_dir), dtype="bfloat16", kv_cache="contiguous", max_num_seqs=10**6, device="cpu")
    per_seq = engine.kv_bytes_per_token * engine.max_model_len
    assert engine.kv.num_blocks == CPU_KV_BUDGET // per_seq and engine.kv_pool.tensor.dtype is torch.bfloat16


def test_pool_is_zeroed_aligned_and_committed_lazily():
    process = psutil.Process()
    before = process.memory_info().rss
    pool = KVPool(num_layers=4, num_blocks=4096, block_size=16, num_kv_heads=8, head_dim=128,
                  dtype=torch.bfloat16, device=torch.device("cpu"))  # 1 GiB
    assert pool.nbytes == 2**30 and pool.tensor.data_ptr() % 64 == 0
    assert process.memory_info().rss - before < 64 * 2**20  # nothing touched yet
    pool.tensor[3, 1, -16:] = 1.5
    assert pool.tensor[3, 1, -16:].eq(1.5).all() and pool.tensor[:, :, :16].eq(0).all()
