"""Planted wrong answers for chapter 06."""
import torch


def gather_kv__ignores_block_table(pool, block_table, context_len):
    return pool.reshape(-1, pool.shape[-1])[:context_len]


def gather_kv__keeps_the_whole_last_block(pool, block_table, context_len):
    return pool.index_select(0, block_table).reshape(-1, pool.shape[-1])


def chunked_attention__no_rescaling(q, chunks, scale):
    m = l = acc = None
    for k, v in chunks:
        s = q @ k.T * scale
        m_new = s.amax(-1, keepdim=True) if m is None else torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        l = p.sum(-1, keepdim=True) if l is None else l + p.sum(-1, keepdim=True)  # old terms never rescaled
        acc = p @ v if acc is None else acc + p @ v
        m = m_new
    return acc / l


def chunked_attention__no_running_max(q, chunks, scale):
    l = acc = 0
    for k, v in chunks:
        p = torch.exp(q @ k.T * scale)  # overflows to inf once scores pass ~700
        l = l + p.sum(-1, keepdim=True)
        acc = acc + p @ v
    return acc / l


def merge_attention__plain_average(o1, lse1, o2, lse2):
    return (o1 + o2) / 2, torch.logaddexp(lse1, lse2)


def merge_attention__unshifted_exp(o1, lse1, o2, lse2):
    w1, w2 = torch.exp(lse1).unsqueeze(-1), torch.exp(lse2).unsqueeze(-1)  # inf for large scores
    return (o1 * w1 + o2 * w2) / (w1 + w2), torch.log(torch.exp(lse1) + torch.exp(lse2))
