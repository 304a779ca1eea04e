"""Chapter 06, reference solutions: `check.gather_kv`, `check.chunked_attention`, `check.merge_attention`."""
import torch


def gather_kv(pool: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """pool [num_blocks, block_size, D] -> the sequence's rows [context_len, D], in token order."""
    blocks = pool.index_select(0, block_table)  # [len(table), block_size, D]: whole blocks, one copy
    return blocks.reshape(-1, pool.shape[-1])[:context_len]


def chunked_attention(q: torch.Tensor, chunks: list, scale: float) -> torch.Tensor:
    """q [M, D]; chunks: (k [S_i, D], v [S_i, D]) in key order -> softmax(q k^T * scale) v, one chunk at a time."""
    m = l = acc = None
    for k, v in chunks:
        s = q @ k.T * scale
        m_new = s.amax(-1, keepdim=True) if m is None else torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        if m is None:
            l, acc = p.sum(-1, keepdim=True), p @ v
        else:
            alpha = torch.exp(m - m_new)  # what the old running values were scaled against, rescaled
            l = l * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + p @ v
        m = m_new
    return acc / l


def merge_attention(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """Two attention results over disjoint key sets -> the result over their union (flash-decoding's merge).

    o [M, D] is each part's softmax-weighted output, lse [M] its log-sum-exp of scores.
    """
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse).unsqueeze(-1), torch.exp(lse2 - lse).unsqueeze(-1)
    return o1 * w1 + o2 * w2, lse
