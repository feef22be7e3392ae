"""RadixCache: the prefix cache, a radix tree (compressed trie) over token ids holding KV segments.

In the style of SGLang / mini-sglang's radix cache. Each non-root node is an edge: a run of token
ids (`key`) and the KV of exactly those tokens (`kv`, a `KVSegment` of the same length). The path
root..node spells a token prefix, and the KV of that prefix is the concatenation of the segments
along the path.

Lifecycle, as the engine uses it:
  admission: `m = cache.match(prompt[:-1]); cache.lock(m.node)`, prefill `prompt[m.length:]` on
             top of `m.kv().to_cache()` (keep at least one token to prefill, hence `[:-1]`).
  finish:    `cache.insert(tokens, kv_source); cache.unlock(m.node)`.

Budget: the cache never holds more than `budget_bytes` of KV. `insert` evicts least-recently-used
unlocked leaves to make room; when everything evictable is gone and the new tokens still do not
fit, it stores the longest prefix of them that fits (possibly nothing) and never exceeds the budget.
Locked nodes (and their ancestors) are never evicted.

Thread-safety: none. Only the engine thread touches the cache, so there is no locking; calling it
from the server's event loop or another thread is a bug.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

import torch

from engine.kv_segment import KVSegment
from engine.radix_node import PrefixMatch, RadixNode

# Either the KV of the whole inserted sequence, or a function giving the KV of tokens [start, end)
# of it, so the engine can copy only the part that is new out of its batch cache.
KVSource = KVSegment | Callable[[int, int], KVSegment]


def _token_list(token_ids: Sequence[int] | torch.Tensor) -> list[int]:
    """Plain ints: 0-d tensors would hash by identity and never match as dict keys."""
    if isinstance(token_ids, torch.Tensor):
        if token_ids.ndim != 1:
            raise ValueError(f"token ids must be 1-D (one sequence), got shape {tuple(token_ids.shape)}; pass one row")
        return token_ids.tolist()
    return list(token_ids)


def common_prefix_len(key: list[int], tokens: list[int], start: int) -> int:
    """Length of the common prefix of `key` and `tokens[start:]`."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == tokens[start : start + n]:
        return n
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i


class RadixCache:
    """Longest-prefix KV cache over token ids, bounded by `budget_bytes`, LRU eviction."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}; set prefix_cache_bytes in models.yaml")
        self.budget_bytes = budget_bytes
        self._uids = itertools.count()
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        """Drop every cached prefix and zero the counters. Refused while requests hold locks."""
        root = getattr(self, "root", None)
        if root is not None and any(c.lock_ref for c in root.children.values()):
            raise RuntimeError("reset() while requests hold locks on the prefix cache; unlock them first")
        self.root = RadixNode(next(self._uids), [], None, None, 0)
        self.size_bytes = 0
        self.num_tokens = 0
        self.num_lookups = 0
        self.lookup_tokens = 0
        self.hit_tokens = 0
        self.evicted_tokens = 0

    @property
    def hit_ratio(self) -> float:
        """Matched tokens / looked-up tokens over all `match` calls since the last reset."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    # ---- lookup -----------------------------------------------------------------------------

    def match(self, token_ids: Sequence[int] | torch.Tensor) -> PrefixMatch:
        """Longest cached prefix of `token_ids`. Splits an edge when the match ends inside it, so
        the returned node covers exactly the matched prefix. Marks the path as recently used."""
        tokens = _token_list(token_ids)
        node, i = self._walk(tokens, split_at_end=True)
        self._touch(node)
        self.num_lookups += 1
        self.lookup_tokens += len(tokens)
        self.hit_tokens += i
        return PrefixMatch(i, node)

    def find(self, token_ids: Sequence[int] | torch.Tensor) -> PrefixMatch:
        """Like `match`, but not counted in the hit statistics: for the engine re-finding a prefix
        it has just inserted (to move a request's lock onto it)."""
        node, i = self._walk(_token_list(token_ids), split_at_end=True)
        self._touch(node)
        return PrefixMatch(i, node)

    def _walk(self, tokens: list[int], split_at_end: bool) -> tuple[RadixNode, int]:
        """Follow `tokens` from the root; returns (deepest node fully matched, tokens matched).
        Splits the edge where the tokens diverge from it (or end inside it, if split_at_end)."""
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = common_prefix_len(child.key, tokens, i)
            if k < len(child.key):
                if i + k == len(tokens) and not split_at_end:
                    return node, i  # tokens end inside this edge: nothing to split for
                node, i = self._split(child, k), i + k
                break
            node, i = child, i + k
        return node, i

    def _split(self, child: RadixNode, k: int) -> RadixNode:
        """Cut `child`'s edge after k tokens: parent -> new(key[:k]) -> child(key[k:]).
        `child` keeps its identity (handles held by requests stay valid); returns the new node."""
        parent = child.parent
        depth = child.depth - len(child.key) + k
        upper = RadixNode(next(self._uids), child.key[:k], child.kv.slice(0, k), parent, depth)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        lower_kv = child.kv.slice(k, len(child.key))
        self.size_bytes += upper.kv.nbytes + lower_kv.nbytes - child.kv.nbytes
        child.key, child.kv, child.parent = child.key[k:], lower_kv, upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    def _touch(self, node: RadixNode) -> None:
        now = next(self._clock)
        while node is not None:
            node.last_access = now
            node = node.parent

    # ---- insertion --------------------------------------------------------------------------

    def insert(self, token_ids: Sequence[int] | torch.Tensor, kv: KVSource) -> int:
        """Cache `token_ids` with their KV; returns how many new tokens were stored.

        `kv` is a KVSegment covering all of `token_ids`, or a function (start, end) -> KVSegment
        for tokens [start, end) of them; only the part not already cached is read. May store
        fewer tokens than are new (a prefix of them) when locked nodes leave no room in the budget.
        """
        tokens = _token_list(token_ids)
        if isinstance(kv, KVSegment) and len(kv) != len(tokens):
            raise ValueError(
                f"insert got {len(tokens)} tokens but KV for {len(kv)}; pass the KV of every token of the "
                f"sequence (KVSegment.concat(prefix, new)) or a function (start, end) -> KVSegment"
            )
        node, i = self._walk(tokens, split_at_end=False)
        if i == len(tokens) or tokens[i] in node.children:  # the latter: tokens end inside an edge
            self._touch(node.children[tokens[i]] if i < len(tokens) else node)
            return 0  # all present
        segment = kv.slice(i, len(tokens)) if isinstance(kv, KVSegment) else kv(i, len(tokens))
        if len(segment) != len(tokens) - i:
            raise ValueError(f"the KV source gave {len(segment)} tokens for [{i}, {len(tokens)}); fix the callable")
        self._lock_path(node, +1)  # keep the attach point (and its ancestors) while making room
        overflow = self.size_bytes + segment.nbytes - self.budget_bytes
        if overflow > 0:
            self.evict(overflow)
        self._lock_path(node, -1)
        room = (self.budget_bytes - self.size_bytes) // max(segment.bytes_per_token, 1)
        n_new = min(len(segment), room)
        if n_new <= 0:
            self._touch(node)
            return 0
        segment = segment if n_new == len(segment) else segment.slice(0, n_new)
        leaf = RadixNode(next(self._uids), tokens[i : i + n_new], segment, node, i + n_new)
        node.children[tokens[i]] = leaf
        self.size_bytes += segment.nbytes
        self.num_tokens += n_new
        self._touch(leaf)
        return n_new

    # ---- locks and eviction -----------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Protect root..node from eviction (one reference per running request)."""
        self._lock_path(node, +1)

    def unlock(self, node: RadixNode) -> None:
        """Release a reference taken by `lock`."""
        self._lock_path(node, -1)

    def _lock_path(self, node: RadixNode | None, delta: int) -> None:
        if node is not None and node is not self.root and node.parent is None:
            raise RuntimeError(f"{node} is no longer in the tree; lock a node right after match() returns it")
        while node is not None and node is not self.root:
            if node.lock_ref + delta < 0:
                raise RuntimeError(f"unlock of {node} without a matching lock; unlock each match once")
            node.lock_ref += delta
            node = node.parent

    @property
    def evictable_bytes(self) -> int:
        return self.size_bytes - sum(n.kv.nbytes for n in self._nodes() if n.lock_ref > 0)

    def evict(self, n_bytes: int) -> int:
        """Evict least-recently-used unlocked leaves until at least `n_bytes` are freed or nothing
        evictable is left; returns the bytes freed."""
        leaves = [(n.last_access, n.uid, n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < n_bytes and leaves:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            del parent.children[node.key[0]]
            freed += node.kv.nbytes
            self.size_bytes -= node.kv.nbytes
            self.num_tokens -= len(node.key)
            self.evicted_tokens += len(node.key)
            node.kv, node.parent = None, None
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, (parent.last_access, parent.uid, parent))
        return freed

    # ---- introspection ----------------------------------------------------------------------

    def _nodes(self) -> list[RadixNode]:
        """Every non-root node, parents before children."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        """Assert the tree's invariants; tests call this after every operation."""
        root = self.root
        assert root.key == [] and root.kv is None and root.parent is None and root.depth == 0
        assert root.lock_ref == 0, "the root is never locked"
        total_bytes = total_tokens = 0
        for node in [root, *self._nodes()]:
            assert node.lock_ref >= 0, f"{node} has a negative lock count"
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()) or node is root, (
                f"{node} has fewer locks than its children together"
            )
            for first, child in node.children.items():
                assert child.parent is node, f"{child} does not point back to its parent {node}"
                assert child.key and child.key[0] == first, f"{child} is filed under token {first}"
                assert child.depth == node.depth + len(child.key), f"{child} has a wrong depth"
            if node is root:
                continue
            assert node.kv is not None and len(node.kv) == len(node.key), f"{node} KV length != key length"
            total_bytes += node.kv.nbytes
            total_tokens += len(node.key)
        assert total_bytes == self.size_bytes, f"size_bytes {self.size_bytes} != sum over nodes {total_bytes}"
        assert total_tokens == self.num_tokens, f"num_tokens {self.num_tokens} != sum over nodes {total_tokens}"
        assert self.size_bytes <= self.budget_bytes, f"{self.size_bytes} bytes exceed the budget {self.budget_bytes}"
        assert 0 <= self.hit_tokens <= self.lookup_tokens
