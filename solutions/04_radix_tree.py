"""Chapter 04, reference solutions: `check.match_prefix`, `check.radix_insert`."""
from nano_infer.exercises.ch04_radix_tree import TreeNode


def _split(child: TreeNode, n: int) -> TreeNode:
    """Cut child's edge after n tokens; the upper part becomes a new node between it and its parent."""
    upper = TreeNode(child.tokens[:n], {}, child.parent)
    child.parent.children[upper.tokens[0]] = upper
    child.tokens, child.parent = child.tokens[n:], upper
    upper.children[child.tokens[0]] = child
    return upper


def match_prefix(root: TreeNode, tokens: list[int]) -> tuple[TreeNode, int]:
    """(node, n): n tokens of `tokens` are in the tree, and node's path from the root is exactly tokens[:n].

    A match that ends inside an edge splits that node there.
    """
    node, pos = root, 0
    while pos < len(tokens):
        child = node.children.get(tokens[pos])
        if child is None:
            break
        n = 0
        while n < len(child.tokens) and pos + n < len(tokens) and child.tokens[n] == tokens[pos + n]:
            n += 1
        if n < len(child.tokens):
            return _split(child, n), pos + n
        node, pos = child, pos + n
    return node, pos


def radix_insert(root: TreeNode, tokens: list[int]) -> TreeNode:
    """Add `tokens` to the tree; returns the node whose path is exactly `tokens`."""
    node, n = match_prefix(root, tokens)
    if n == len(tokens):
        return node
    leaf = TreeNode(tuple(tokens[n:]), {}, node)
    node.children[tokens[n]] = leaf
    return leaf
