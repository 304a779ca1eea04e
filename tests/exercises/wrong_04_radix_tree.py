"""Planted wrong answers for chapter 04."""
from nano_infer.exercises.ch04_radix_tree import TreeNode


def _walk(root, tokens):
    node, pos = root, 0
    while pos < len(tokens):
        child = node.children.get(tokens[pos])
        if child is None:
            return node, pos, None, 0
        n = 0
        while n < len(child.tokens) and pos + n < len(tokens) and child.tokens[n] == tokens[pos + n]:
            n += 1
        if n < len(child.tokens):
            return node, pos, child, n
        node, pos = child, pos + n
    return node, pos, None, 0


def match_prefix__does_not_split(root, tokens):
    node, pos, child, n = _walk(root, tokens)
    return node, pos + n


def match_prefix__counts_the_whole_edge(root, tokens):
    node, pos, child, n = _walk(root, tokens)
    if child is None:
        return node, pos
    return child, pos + len(child.tokens)


def match_prefix__split_drops_the_children(root, tokens):
    node, pos, child, n = _walk(root, tokens)
    if child is None:
        return node, pos
    upper = TreeNode(child.tokens[:n], {}, node)
    node.children[upper.tokens[0]] = upper
    lower = TreeNode(child.tokens[n:], {}, upper)  # a fresh node: the old one's children are lost
    upper.children[lower.tokens[0]] = lower
    return upper, pos + n


def radix_insert__no_split(root, tokens):
    node, pos, child, n = _walk(root, tokens)
    if child is None and pos == len(tokens):
        return node
    leaf = TreeNode(tuple(tokens[pos:]), {}, node)
    node.children[tokens[pos]] = leaf  # replaces a child that shared only its first tokens
    return leaf


def radix_insert__new_leaf_without_parent(root, tokens):
    node, pos, child, n = _walk(root, tokens)
    if child is not None:
        upper = TreeNode(child.tokens[:n], {}, node)
        node.children[upper.tokens[0]] = upper
        child.tokens, child.parent = child.tokens[n:], upper
        upper.children[child.tokens[0]] = child
        node, pos = upper, pos + n
    if pos == len(tokens):
        return node
    leaf = TreeNode(tuple(tokens[pos:]), {}, None)
    node.children[tokens[pos]] = leaf
    return leaf
