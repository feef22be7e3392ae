"""The radix tree's parts (engine/radix_cache.py): a node, one edge of token ids and their KV, and
the result of a match, which reads the KV along the matched path."""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv_segment import KVSegment


class RadixNode:
    """One edge of the tree: `key` tokens and their KV. The root has an empty key and no KV."""

    __slots__ = ("uid", "key", "kv", "parent", "children", "lock_ref", "last_access", "depth")

    def __init__(self, uid: int, key: list[int], kv: KVSegment | None, parent: RadixNode | None, depth: int):
        self.uid = uid
        self.key = key
        self.kv = kv
        self.parent = parent
        self.children: dict[int, RadixNode] = {}  # first token of the child's key -> child
        self.lock_ref = 0  # running requests whose matched path goes through this node
        self.last_access = 0
        self.depth = depth  # tokens from the root to the end of this edge

    def __repr__(self) -> str:
        return f"RadixNode(uid={self.uid}, depth={self.depth}, len={len(self.key)}, lock={self.lock_ref})"


@dataclass(frozen=True)
class PrefixMatch:
    """Result of `RadixCache.match`: `length` tokens are cached, ending exactly at `node`."""

    length: int
    node: RadixNode  # handle for lock/unlock; the root when length == 0

    def kv(self) -> KVSegment | None:
        """The KV of the matched prefix (a fresh concatenation), or None when length == 0.

        Call it right after `match`, or `lock` the node first: an unlocked node may be evicted.
        """
        if self.length == 0:
            return None
        if self.node.parent is None:  # only leaves are evicted, so an evicted path starts here
            raise RuntimeError(
                "the matched prefix was evicted before its KV was read; lock(match.node) right after "
                "match() and unlock it when the request finishes"
            )
        segments: list[KVSegment] = []
        node = self.node
        while node.parent is not None:
            segments.append(node.kv)
            node = node.parent
        return KVSegment.concat(segments[::-1])
