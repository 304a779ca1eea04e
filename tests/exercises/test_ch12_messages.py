"""Chapter 12's exercise 3 names the usual mistakes for what they are: the copy counted once is not
shown as a tie (which reads like a `<` against `<=` slip), and a tie says it is one."""
from nano_infer.exercises import check


def copy_once(num_blocks, num_recompute_tokens, bytes_per_block, copy_bytes_per_s, prefill_tokens_per_s):
    copy = num_blocks * bytes_per_block / copy_bytes_per_s  # out only: the way back forgotten
    return "swap" if copy < num_recompute_tokens / prefill_tokens_per_s else "recompute"


def swap_on_ties(num_blocks, num_recompute_tokens, bytes_per_block, copy_bytes_per_s, prefill_tokens_per_s):
    swap = 2 * num_blocks * bytes_per_block / copy_bytes_per_s
    return "swap" if swap <= num_recompute_tokens / prefill_tokens_per_s else "recompute"


def test_the_copy_counted_once_is_told_so_and_not_shown_as_a_tie():
    result = check.swap_or_recompute(copy_once, quiet=True)
    assert not result
    assert "out now and back in later" in result.message and "single copy" in result.message, result.message
    assert "tie" not in result.message, result.message


def test_a_tie_says_the_swap_must_be_strictly_faster():
    result = check.swap_or_recompute(swap_on_ties, quiet=True)
    assert not result
    assert "a tie" in result.message and "strictly faster" in result.message, result.message
