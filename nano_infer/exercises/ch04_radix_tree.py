"""Chapter 04 exercises: a token-level radix tree's match with node splitting, and its insert.

The tree is the chapter's RadixNode with the KV blocks left out (block_size 1): each node
holds a run of tokens (its edge) and its children keyed by their first token.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from .core import call, exercise, expect, forall


@dataclass(eq=False)
class TreeNode:
    tokens: tuple[int, ...] = ()
    children: dict[int, "TreeNode"] = field(default_factory=dict)  # keyed by the child's first token
    parent: "TreeNode | None" = None

    def __repr__(self) -> str:  # a node prints as its path from the root, never as the whole subtree
        return f"TreeNode(path={list(path_of(self))})"


def path_of(node: TreeNode) -> tuple[int, ...]:
    parts = []
    while node is not None:
        parts.append(node.tokens)
        node = node.parent
    return tuple(t for part in reversed(parts) for t in part)


def _reference_insert(root: TreeNode, tokens: list[int]) -> TreeNode:
    node, pos = root, 0
    while pos < len(tokens):
        child = node.children.get(tokens[pos])
        if child is None:
            leaf = TreeNode(tuple(tokens[pos:]), {}, node)
            node.children[tokens[pos]] = leaf
            return leaf
        n = 0
        while n < len(child.tokens) and pos + n < len(tokens) and child.tokens[n] == tokens[pos + n]:
            n += 1
        if n < len(child.tokens):
            upper = TreeNode(child.tokens[:n], {}, node)
            node.children[tokens[pos]] = upper
            child.tokens, child.parent = child.tokens[n:], upper
            upper.children[child.tokens[0]] = child
            child = upper
        node, pos = child, pos + n
    return node


def _nodes(root: TreeNode) -> list[TreeNode]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _describe(root: TreeNode) -> str:
    """The tree as its edges, e.g. {[1, 2]: {[3]: {}, [4]: {}}}."""
    def walk(node):
        return "{" + ", ".join(f"{list(c.tokens)}: {walk(c)}" for _, c in sorted(node.children.items())) + "}"
    return walk(root)


def _prefixes(root: TreeNode) -> set[tuple[int, ...]]:
    """Every token sequence the tree holds: each node's path and every point inside its edge."""
    out = set()
    for node in _nodes(root):
        base = path_of(node.parent) if node.parent is not None else ()
        for k in range(1, len(node.tokens) + 1):
            out.add(base + node.tokens[:k])
    return out


def _check_shape(root: TreeNode, case: str) -> None:
    for node in _nodes(root):
        for first, child in node.children.items():
            expect(child.parent is node, case, why=f"the child {list(child.tokens)} of {node} has the wrong parent "
                   f"(tree: {_describe(root)})")
            expect(len(child.tokens) > 0 and child.tokens[0] == first, case,
                   why=f"children must be keyed by the first token of their edge; key {first} holds edge "
                       f"{list(child.tokens)} (tree: {_describe(root)})")


_seq = st.lists(st.integers(0, 2), min_size=1, max_size=7)


@exercise
def match_prefix(candidate):
    """Your match finds the longest cached prefix, splits the edge it ends in, and keeps everything else."""

    def prop(case):
        cached, query = case
        root = TreeNode()
        for tokens in cached:
            _reference_insert(root, tokens)
        before, shape, count = _prefixes(root), _describe(root), len(_nodes(root))
        want = max((k for k in range(len(query) + 1) if k == 0 or tuple(query[:k]) in before), default=0)
        ends_at_node = want == 0 or any(path_of(n) == tuple(query[:want]) for n in _nodes(root)[1:])
        desc = f"the tree {shape} (from inserting {cached}), match_prefix(root, {query})"
        got = call(candidate, root, list(query), case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, why=f"return (node, matched_length), got {got!r}")
        node, matched = got
        expect(matched == want, desc, want, matched, why="matched length:")
        expect(isinstance(node, TreeNode) and path_of(node) == tuple(query[:want]), desc, list(query[:want]),
               list(path_of(node)) if isinstance(node, TreeNode) else node,
               why="the returned node's path from the root should be exactly the matched tokens:")
        expect(node in _nodes(root), desc, why="the returned node is not in the tree")
        _check_shape(root, desc)
        expect(_prefixes(root) == before, desc, shape, _describe(root),
               why="matching must not change which token sequences the tree holds:")
        new = len(_nodes(root)) - count
        expect(new == (0 if ends_at_node else 1), desc, 0 if ends_at_node else 1, new,
               why="nodes added (one split when the match ends inside an edge, else none):")

    forall(st.tuples(st.lists(_seq, max_size=4), _seq), prop, max_examples=50,
           examples=[([[1, 2, 3, 4]], [1, 2, 5]), ([[1, 2, 3, 4], [1, 2, 3, 4, 0, 0]], [1, 2])])


@exercise
def radix_insert(candidate):
    """Your insert makes the tree hold exactly the prefixes of everything inserted, returning the node of the whole sequence."""

    def prop(seqs):
        root, held, done = TreeNode(), set(), []
        for tokens in seqs:
            done.append(tokens)
            desc = f"radix_insert(root, ...) of {done} in that order"
            node = call(candidate, root, list(tokens), case=desc)
            held |= {tuple(tokens[:k]) for k in range(1, len(tokens) + 1)}
            expect(isinstance(node, TreeNode) and path_of(node) == tuple(tokens), desc, list(tokens),
                   list(path_of(node)) if isinstance(node, TreeNode) else node,
                   why="the returned node's path from the root should be the inserted tokens:")
            _check_shape(root, desc)
            got = _prefixes(root)
            missing, extra = sorted(held - got), sorted(got - held)
            expect(not missing and not extra, desc, why=f"the tree {_describe(root)} "
                   + (f"lost {[list(m) for m in missing[:3]]}" if missing else f"holds {[list(e) for e in extra[:3]]} never inserted"))
            count = len(_nodes(root))
            again = call(candidate, root, list(tokens), case=desc + ", then the last one again")
            expect(again is node and len(_nodes(root)) == count, desc + ", then the last one again",
                   why="inserting a sequence the tree already holds must return its node and add nothing")

    forall(st.lists(_seq, min_size=1, max_size=5), prop, max_examples=50,
           examples=[[[1, 2, 3], [1, 2, 4]], [[1, 2, 3], [1]]])
