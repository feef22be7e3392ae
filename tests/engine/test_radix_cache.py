"""Unit tests of the radix tree in engine/radix_cache.py, on tiny fake KV segments.

A fake segment for tokens t at positions p is a [1, 2, 1, n, 1] float32 tensor holding t (as
"keys") and p (as "values"), 8 bytes a token; so the KV a match returns can be checked exactly.
"""

import random

import pytest
import torch

from engine.kv_segment import KVSegment
from engine.radix_cache import RadixCache

BPT = 8  # bytes per token of a fake segment


def fake_kv(tokens, start=0):
    t = torch.tensor(tokens, dtype=torch.float32)
    p = torch.arange(start, start + len(tokens), dtype=torch.float32)
    return KVSegment(torch.stack([t, p]).reshape(1, 2, 1, len(tokens), 1))


def assert_kv_is(match, tokens):
    kv = match.kv()
    if match.length == 0:
        assert kv is None
        return
    assert kv.data[0, 0, 0, :, 0].tolist() == list(map(float, tokens[: match.length]))
    assert kv.data[0, 1, 0, :, 0].tolist() == list(map(float, range(match.length)))


def test_empty_cache_matches_nothing():
    c = RadixCache(1 << 20)
    m = c.match([1, 2, 3])
    assert m.length == 0 and m.node is c.root and m.kv() is None
    assert c.hit_ratio == 0.0 and c.num_lookups == 1
    c.check_integrity()


def test_insert_then_match_full_and_partial_with_split():
    c = RadixCache(1 << 20)
    assert c.insert([1, 2, 3, 4, 5], fake_kv([1, 2, 3, 4, 5])) == 5
    c.check_integrity()
    m = c.match([1, 2, 3, 4, 5, 6])
    assert m.length == 5 and m.node.depth == 5
    assert_kv_is(m, [1, 2, 3, 4, 5])
    m = c.match([1, 2, 3, 9])  # ends mid-edge: the edge is split at 3
    c.check_integrity()
    assert m.length == 3 and m.node.depth == 3 and m.node.key == [1, 2, 3]
    assert_kv_is(m, [1, 2, 3])
    assert [ch.key for ch in m.node.children.values()] == [[4, 5]]
    assert c.num_tokens == 5 and c.size_bytes == 5 * BPT
    assert c.hit_tokens == 8 and c.lookup_tokens == 10 and c.hit_ratio == pytest.approx(0.8)


def test_shared_prefix_stores_only_new_tokens():
    c = RadixCache(1 << 20)
    c.insert([1, 2, 3, 4], fake_kv([1, 2, 3, 4]))
    assert c.insert([1, 2, 5, 6, 7], fake_kv([1, 2, 5, 6, 7])) == 3
    c.check_integrity()
    (mid,) = c.root.children.values()
    assert mid.key == [1, 2] and sorted(ch.key for ch in mid.children.values()) == [[3, 4], [5, 6, 7]]
    assert c.num_tokens == 7
    assert_kv_is(c.match([1, 2, 5, 6, 7]), [1, 2, 5, 6, 7])
    assert_kv_is(c.match([1, 2, 3, 4, 0]), [1, 2, 3, 4])


def test_insert_already_present_or_ending_inside_an_edge_stores_nothing():
    c = RadixCache(1 << 20)
    c.insert([1, 2, 3, 4], fake_kv([1, 2, 3, 4]))
    assert c.insert([1, 2, 3, 4], fake_kv([1, 2, 3, 4])) == 0
    assert c.insert([1, 2], fake_kv([1, 2])) == 0
    assert len(c.root.children) == 1 and c.root.children[1].key == [1, 2, 3, 4]  # no split needed
    c.check_integrity()


def test_insert_reads_only_the_new_range_from_a_callable_source():
    c = RadixCache(1 << 20)
    c.insert([1, 2, 3], fake_kv([1, 2, 3]))
    calls = []
    full = fake_kv([1, 2, 3, 7, 8])

    def source(start, end):
        calls.append((start, end))
        return full.slice(start, end)

    assert c.insert([1, 2, 3, 7, 8], source) == 2
    assert calls == [(3, 5)]
    assert_kv_is(c.match([1, 2, 3, 7, 8]), [1, 2, 3, 7, 8])
    c.check_integrity()


def test_token_ids_may_be_a_1d_tensor():
    c = RadixCache(1 << 20)
    assert c.insert(torch.tensor([1, 2, 3]), fake_kv([1, 2, 3])) == 3
    assert c.match(torch.tensor([1, 2, 4])).length == 2
    assert c.match([1, 2, 3]).length == 3
    with pytest.raises(ValueError, match="1-D"):
        c.match(torch.tensor([[1, 2]]))
    c.check_integrity()


def test_insert_with_wrong_kv_length_is_refused():
    c = RadixCache(1 << 20)
    with pytest.raises(ValueError, match="tokens but KV for"):
        c.insert([1, 2, 3], fake_kv([1, 2]))


def test_eviction_is_least_recently_used_first():
    c = RadixCache(1 << 20)
    for first in (1, 2, 3):
        c.insert([first, 0, 0], fake_kv([first, 0, 0]))
    c.match([1, 0, 0])  # 1 is now the most recently used; 2 the least
    assert c.evict(3 * BPT) == 3 * BPT
    assert sorted(c.root.children) == [1, 3]
    assert c.evict(1) == 3 * BPT  # evicts whole leaves: next is 3
    assert sorted(c.root.children) == [1]
    c.check_integrity()


def test_eviction_cascades_to_parents_that_become_leaves():
    c = RadixCache(1 << 20)
    c.insert([1, 2, 3], fake_kv([1, 2, 3]))
    c.insert([1, 2, 4], fake_kv([1, 2, 4]))
    assert c.num_tokens == 4
    assert c.evict(1 << 20) == 4 * BPT
    assert c.num_tokens == 0 and c.size_bytes == 0 and not c.root.children
    c.check_integrity()


def test_locked_prefix_is_never_evicted_and_unlock_releases_it():
    c = RadixCache(1 << 20)
    c.insert([1, 2, 3, 4], fake_kv([1, 2, 3, 4]))
    c.insert([5, 6], fake_kv([5, 6]))
    m = c.match([1, 2, 3, 9])  # splits [1,2,3 | 4]; the [4] leaf stays unlocked
    c.lock(m.node)
    c.check_integrity()
    assert c.evictable_bytes == 3 * BPT
    assert c.evict(1 << 20) == 3 * BPT  # [4] and [5,6] go, [1,2,3] stays
    assert c.match([1, 2, 3]).length == 3
    assert_kv_is(m, [1, 2, 3])
    c.unlock(m.node)
    c.check_integrity()
    assert c.evict(1 << 20) == 3 * BPT and c.num_tokens == 0
    with pytest.raises(RuntimeError, match="evicted"):
        m.kv()


def test_unlock_without_lock_is_an_error():
    c = RadixCache(1 << 20)
    c.insert([1, 2], fake_kv([1, 2]))
    m = c.match([1, 2])
    with pytest.raises(RuntimeError, match="without a matching lock"):
        c.unlock(m.node)


def test_split_of_a_locked_edge_keeps_the_handle_and_lock_counts():
    c = RadixCache(1 << 20)
    c.insert([1, 2, 3, 4], fake_kv([1, 2, 3, 4]))
    held = c.match([1, 2, 3, 4])
    c.lock(held.node)
    inner = c.match([1, 2, 7])  # splits the locked edge above the held node
    assert inner.node.lock_ref == 1 and held.node.depth == 4
    c.check_integrity()
    assert_kv_is(held, [1, 2, 3, 4])
    c.unlock(held.node)
    c.check_integrity()
    assert inner.node.lock_ref == 0


def test_insert_evicts_to_stay_within_budget():
    c = RadixCache(10 * BPT)
    assert c.insert([1] * 6, fake_kv([1] * 6)) == 6
    assert c.insert([2] * 6, fake_kv([2] * 6)) == 6  # evicts the [1]*6 leaf
    assert c.match([1]).length == 0 and c.size_bytes == 6 * BPT
    c.check_integrity()


def test_insert_stores_a_shorter_prefix_when_locks_leave_no_room():
    c = RadixCache(10 * BPT)
    c.insert([1] * 6, fake_kv([1] * 6))
    c.lock(c.match([1] * 6).node)
    assert c.insert([2] * 6, fake_kv([2] * 6)) == 4  # only 4 tokens fit next to the locked 6
    assert c.match([2] * 6).length == 4 and c.size_bytes == 10 * BPT
    assert c.insert([3, 3], fake_kv([3, 3])) == 2  # evicts the unlocked [2]*4 to make room
    c.check_integrity()


def test_insert_keeps_its_attach_point_when_evicting():
    c = RadixCache(6 * BPT)
    c.insert([1, 2, 3], fake_kv([1, 2, 3]))  # unlocked, least recently used, and the attach point
    assert c.insert([1, 2, 3, 4, 5, 6, 7], fake_kv([1, 2, 3, 4, 5, 6, 7])) == 3
    assert_kv_is(c.match([1, 2, 3, 4, 5, 6, 7]), [1, 2, 3, 4, 5, 6])
    c.check_integrity()


def test_reset_clears_everything_but_refuses_while_locked():
    c = RadixCache(1 << 20)
    c.insert([1, 2], fake_kv([1, 2]))
    m = c.match([1, 2])
    c.lock(m.node)
    with pytest.raises(RuntimeError, match="unlock"):
        c.reset()
    c.unlock(m.node)
    c.reset()
    assert c.num_tokens == 0 and c.size_bytes == 0 and c.lookup_tokens == 0 and not c.root.children
    c.check_integrity()


# ---- randomized: 500 ops against a brute-force model -----------------------------------------


def cached_prefixes(cache):
    """Brute force: every token prefix spelled by a root..node path of the tree (a set of tuples)."""
    out = {()}
    stack = [(cache.root, ())]
    while stack:
        node, path = stack.pop()
        for child in node.children.values():
            full = path + tuple(child.key)
            out.update(full[:k] for k in range(len(path) + 1, len(full) + 1))
            stack.append((child, full))
    return out


def brute_lcp(query, sequences):
    best = 0
    for s in sequences:
        k = 0
        while k < min(len(s), len(query)) and s[k] == query[k]:
            k += 1
        best = max(best, k)
    return best


def test_random_operations_against_brute_force():
    rng = random.Random(1234)
    cache = RadixCache(24 * BPT)
    stems = [[rng.randrange(4) for _ in range(rng.randrange(1, 12))] for _ in range(6)]
    alive: list[tuple[int, ...]] = []  # inserted and not (yet) evicted, each truncated to what survives
    ever: list[tuple[int, ...]] = []  # everything ever inserted
    held = []  # (query, match) with a lock taken
    truncated = 0  # inserts that stored fewer tokens than were new, for lack of room

    def random_seq():
        return rng.choice(stems)[: rng.randrange(0, 12)] + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]

    for _ in range(500):
        op = rng.choice(["insert", "insert", "match", "lock", "lock", "unlock", "evict"])
        if op == "insert":
            seq = random_seq()
            before = brute_lcp(seq, alive)
            n_new = cache.insert(seq, fake_kv(seq))
            assert 0 <= n_new <= len(seq) - before
            truncated += n_new < len(seq) - before
            stored = tuple(seq[: before + n_new])
            alive.append(stored)
            ever.append(stored)
        elif op in ("match", "lock"):
            seq = random_seq()
            expected = brute_lcp(seq, alive)
            m = cache.match(seq)
            assert m.length == expected and m.node.depth == expected
            assert_kv_is(m, seq)
            if op == "lock":
                cache.lock(m.node)
                held.append((seq, m))
        elif op == "unlock" and held:
            _, m = held.pop(rng.randrange(len(held)))
            cache.unlock(m.node)
        elif op == "evict":
            cache.evict(rng.randrange(0, 60 * BPT))
        cache.check_integrity()
        # What the tree holds now: eviction only ever shortens what was inserted.
        present = cached_prefixes(cache)
        for i, s in enumerate(alive):
            k = len(s)
            while s[:k] not in present:
                k -= 1
            alive[i] = s[:k]
        assert all(any(s[: len(p)] == p for s in ever) for p in present), "tree holds a prefix never inserted"
        assert all(brute_lcp(q, alive) >= m.length for q, m in held), "a locked prefix was evicted"
    assert cache.lookup_tokens > 0 and 0 < cache.hit_ratio < 1
    assert cache.evicted_tokens > 0 and truncated > 0, "the op mix no longer exercises eviction"
