"""SparseMask: the CPU fast path masks logits exactly as the packed bitmask does, state by state."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.constraint_hook import ConstraintMasker
from engine.sampling import Narrowed, SamplingParams, sample, settle
from grammar_fixtures import SMOLLM2_VOCAB_SIZE as V
from grammar_fixtures import shared_compiler, smollm2_tokenizer, smollm2_vocabulary
import numpy as np

from grammars import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmasks, schema_to_regex
from grammars.index.budget import ALLOWED, BANNED, NONE, build_budget_table, budget_table_from_transitions
from grammars.match.grammar import CompiledGrammar
from grammars.masks.sparse_mask import SparseMask, apply_sparse_mask_inplace, rows_routine, sparse_mask
from grammars.tools.tool_constraint import compile_tool_constraint
from grammars.tools.tool_grammar import tool_grammar
from grammars.masks.trigger_mask import trigger_masks

SCHEMA = {  # a variant of test_grammars_matcher's, so its states are first built here
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 20},
        "count": {"type": "integer"},
        "mood": {"enum": ["calm", "angry", "sleepy"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["title", "count", "mood"],
    "additionalProperties": False,
}


class HalfMask:
    """A constraint with a mid-sized mask (every other token) and no sparse form: the bitmask path."""

    def __init__(self):
        self.row = torch.full(((V + 31) // 32,), 0x55555555, dtype=torch.int32)

    def fill(self, row, budget=None):
        row.copy_(self.row)

    def sparse_mask(self, budget=None):
        return sparse_mask(self.row, V)


def kind(constraint) -> str:
    sparse = constraint.sparse_mask()
    return "none" if sparse is None else "allowed" if sparse.allowed else "disallowed"


SAMPLED = SamplingParams(temperature=1.0)  # a sampled row: the masker writes its mask into the logits
GREEDY = SamplingParams(temperature=0.0)  # a greedy one may be narrowed to its allowed ids instead


def masked_both_ways(logits, constraints):
    """(bitmask path, ConstraintMasker) results for one batch; None = an unconstrained row. Also
    checks the greedy rows' narrowing: sample() over the narrowed rows picks the bitmask path's argmax."""
    reference, fast, greedy = logits.clone(), logits.clone(), logits.clone()
    bitmask = allocate_token_bitmask(len(constraints), V)
    pairs = [(row, c) for row, c in enumerate(constraints) if c is not None]
    fill_next_token_bitmasks(pairs, bitmask)
    apply_token_bitmask_inplace(reference, bitmask, rows=[row for row, _ in pairs])
    narrowed = ConstraintMasker(V, 2)(fast, [SimpleNamespace(constraint=c, tokens_left=None, params=SAMPLED)
                                             for c in constraints])
    assert narrowed == {}
    narrowed = ConstraintMasker(V, 2)(greedy, [SimpleNamespace(constraint=c, tokens_left=None, params=GREEDY)
                                               for c in constraints])
    for row in narrowed:
        assert torch.equal(greedy[row], logits[row])  # a narrowed row is not written by the masker
    n = len(constraints)
    assert sample(greedy, [GREEDY] * n, [None] * n, narrowed) == reference.argmax(-1).tolist()
    return reference, fast


def walk_and_compare(constraint, seed, steps=300, inference_every=2):
    """Greedy walk on random logits; at each step both paths must give identical logits."""
    gen = torch.Generator().manual_seed(seed)
    tok, vocab = smollm2_tokenizer(), smollm2_vocabulary()
    closers = [tok.convert_tokens_to_ids(c) for c in ['"', "}", "]", ","]] + sorted(vocab.eos_token_ids)
    logits = torch.empty(4, V)
    kinds, eos_seen = set(), False
    half = HalfMask()
    for step in range(steps):
        logits.normal_(generator=gen)
        if step > 30:
            logits[1, closers] += 8.0
        batch = [None, constraint, half, None]  # unconstrained rows around constrained ones
        with torch.inference_mode(step % inference_every == 0):
            constraint.sparse_mask()  # a first ask: without stored forms, the masker's (second) gets one
            reference, fast = masked_both_ways(logits, batch)
        assert torch.equal(reference, fast), f"step {step}: fast path differs ({kind(constraint)})"
        kinds.add(kind(constraint))
        assert torch.isfinite(fast[0]).all() and torch.isfinite(fast[3]).all()
        eos_seen |= any(bool(torch.isfinite(fast[1, e])) for e in vocab.eos_token_ids)
        if constraint.is_terminated():
            break
        forced = constraint.forced()
        for token in forced or [int(torch.argmax(fast[1]))]:
            constraint.advance(token)
    return kinds, eos_seen


@pytest.mark.parametrize("seed", range(4))
def test_matcher_fast_path_equals_bitmask_path(seed):
    grammar = shared_compiler().compile_json_schema(SCHEMA)
    kinds, eos_seen = walk_and_compare(grammar.matcher(), seed)
    assert {"allowed", "disallowed"} <= kinds and eos_seen


FREE_SCHEMA = {"type": "object", "properties": {"meta": {}, "tags": {"type": "array"},
                                               "opts": {"type": "object", "additionalProperties": True}},
               "required": ["meta", "tags", "opts"], "additionalProperties": False}


@pytest.mark.parametrize("seed", range(3))
def test_free_values_fast_path_equals_bitmask_path(seed):
    """Inside and around free values (HoleMatcher: HoleTables' rows and sparse forms, greedy rows
    narrowed) the fast path masks as the bitmask path does."""
    grammar = shared_compiler().compile_json_schema(FREE_SCHEMA)
    kinds, _ = walk_and_compare(grammar.matcher(), seed, steps=200)
    assert {"allowed", "disallowed"} <= kinds
    assert any(key[0] == "value" for key in grammar.hole_tables().memo)  # the walk went inside a value


def test_sparse_mask_comes_from_compile_time_on_a_states_first_visit():
    grammar = shared_compiler().compile_json_schema({"enum": ["first", "second"]})
    matcher = grammar.matcher()
    sparse = matcher.sparse_mask()  # stored in the budget table: no row built for it
    assert sparse.allowed and sparse is matcher.sparse_mask() is grammar.matcher().sparse_mask()
    assert not grammar._masks
    row = torch.zeros(grammar.width, dtype=torch.int32)
    matcher.fill(row)
    assert sparse_mask(row, V).ids.tolist() == sparse.ids.tolist() and sparse.ids.dtype == torch.int64


def test_without_stored_forms_the_sparse_mask_is_built_on_a_states_second_visit():
    compiled = shared_compiler().compile_json_schema({"enum": ["first", "second"]})
    table = build_budget_table(compiled.index)  # no vocab_size: no sparse forms (older cache entries)
    assert table.sparse is None
    grammar = CompiledGrammar(compiled.index, compiled.regex, compiled.vocabulary, "lazy", table)
    matcher = grammar.matcher()
    assert matcher.sparse_mask() is None  # first visit: the packed bitmask path
    sparse = matcher.sparse_mask()
    assert sparse.allowed and sparse is matcher.sparse_mask() is grammar.matcher().sparse_mask()
    assert sparse.ids.tolist() == compiled.matcher().sparse_mask().ids.tolist()


def state_row(grammar, state) -> torch.Tensor:
    """int32 [W]: what CompiledGrammar._build writes for ``state`` (its tokens, every EOS if final)."""
    words = np.zeros(grammar.width, dtype=np.uint32)
    tokens = list(grammar.index.get_allowed_tokens(state))
    if grammar.is_final(state):
        tokens += sorted(grammar.vocabulary.eos_token_ids)
    for t in tokens:
        words[t >> 5] |= np.uint32(1 << (t & 31))
    return torch.from_numpy(words.view(np.int32))


def test_stored_sparse_forms_equal_the_rows_of_every_state():
    """Every state of a real grammar (strings, numbers, enums, arrays, final states): the forms the
    compile worker stored are sparse_mask() of the state's row; so are the token counts."""
    grammar = shared_compiler().compile_json_schema(SCHEMA)
    table, eos = grammar.budget, grammar.vocabulary.eos_token_id
    assert table.sparse is not None and len(table.keys) > 50
    kinds = set()
    for state in table.keys.tolist():
        kind, ids = table.sparse_ids(state, V)
        expected = sparse_mask(state_row(grammar, state), V)
        kinds.add(kind)
        if expected is None:
            assert kind == NONE and len(ids) == 0, state
        else:
            assert kind == (ALLOWED if expected.allowed else BANNED), state
            assert ids.tolist() == expected.ids.tolist(), state
        tokens = grammar.index.get_allowed_tokens(state)
        assert table.state_count(state) == len(tokens) - (eos in tokens), state
    assert {ALLOWED, BANNED} <= kinds


def test_python_table_has_the_c_tables_sparse_forms():
    grammar = shared_compiler().compile_json_schema(SCHEMA)
    vocab = grammar.vocabulary
    fast = build_budget_table(grammar.index, vocab.size, vocab.eos_token_ids)
    slow = budget_table_from_transitions(grammar.index, vocab.size, vocab.eos_token_ids)
    assert slow.sparse is not None and sorted(fast.keys.tolist()) == sorted(slow.keys.tolist())
    for state in fast.keys.tolist():
        (kind, ids), (kind_slow, ids_slow) = fast.sparse_ids(state, V), slow.sparse_ids(state, V)
        assert kind == kind_slow and ids.tolist() == ids_slow.tolist(), state
        assert fast.state_count(state) == slow.state_count(state), state


def test_a_grammar_over_the_cap_keeps_no_sparse_forms():
    grammar = shared_compiler().compile_json_schema(SCHEMA)
    vocab = grammar.vocabulary
    for build in (build_budget_table, budget_table_from_transitions):
        table = build(grammar.index, vocab.size, vocab.eos_token_ids, ids_cap=100)
        assert table.sparse is None and table.sparse_ids(grammar.initial_state, V) is None
        assert table.distance_of(grammar.initial_state) == grammar.min_tokens(grammar.initial_state)


def test_forced_and_is_terminated_need_no_row():
    """The stored counts give single_token / allowed_count without writing the state's mask."""
    grammar = shared_compiler().compile_json_schema({"enum": ["alpha", "beta"]})
    matcher = grammar.matcher()
    quote = smollm2_tokenizer().convert_tokens_to_ids('"')
    assert matcher.forced() == [quote] and not matcher.is_terminated()
    for token in smollm2_tokenizer().encode('"beta"', add_special_tokens=False):
        matcher.advance(token)
    assert matcher.forced() == [] and matcher.is_terminated()
    assert not grammar._masks


class FillCounter:
    """A constraint whose sparse form is always known: the masker must not fill it on CPU."""

    def __init__(self):
        self.fills, self.budgets = 0, []
        self.sparse = SparseMask(True, torch.tensor([3, 5]), V)

    def fill(self, row, budget=None):
        self.fills += 1
        row.zero_()
        row[0] = 0b101000

    def sparse_mask(self, budget=None):
        self.budgets.append(budget)
        return self.sparse


def test_masker_skips_the_fill_of_rows_with_a_sparse_form():
    constraint = FillCounter()
    logits = torch.randn(2, V)
    ConstraintMasker(V, 2)(logits, [SimpleNamespace(constraint=None, tokens_left=None, params=SAMPLED),
                                    SimpleNamespace(constraint=constraint, tokens_left=17, params=SAMPLED)])
    assert constraint.fills == 0 and constraint.budgets == [17]
    assert torch.isfinite(logits[1]).nonzero().view(-1).tolist() == [3, 5] and torch.isfinite(logits[0]).all()


def test_a_greedy_row_with_an_allowed_list_is_narrowed_not_written():
    constraint = FillCounter()
    logits = torch.randn(2, V)
    before = logits.clone()
    narrowed = ConstraintMasker(V, 2)(logits, [SimpleNamespace(constraint=None, tokens_left=None, params=GREEDY),
                                               SimpleNamespace(constraint=constraint, tokens_left=17, params=GREEDY)])
    assert constraint.fills == 0 and list(narrowed) == [1] and narrowed[1] is constraint.sparse
    assert torch.equal(logits, before)
    best = 3 if before[1, 3] >= before[1, 5] else 5
    assert sample(logits, [GREEDY, GREEDY], [None, None], narrowed) == [int(before[0].argmax()), best]
    with_logprobs = SamplingParams(temperature=0.0, logprobs=2)  # its logprobs read the whole masked row
    assert ConstraintMasker(V, 2)(logits, [SimpleNamespace(constraint=constraint, tokens_left=17,
                                                           params=with_logprobs)]) == {}
    assert torch.isfinite(logits[0]).nonzero().view(-1).tolist() == [3, 5]


def test_the_masker_hands_the_pick_its_call_only_over_float32_rows_it_read():
    """Narrowed.picker: settle()'s one C call over the logits the masker read (float32 on the CPU,
    rows of unit stride), with the tokens settle() picks when it reads the logits itself; none over
    rows of another stride, and no narrowed row at all over float64 logits (they are written)."""
    seqs = [SimpleNamespace(constraint=FillCounter(), tokens_left=17, params=GREEDY) for _ in range(3)]

    def best(logits):
        return [3 if logits[row, 3] >= logits[row, 5] else 5 for row in range(3)]

    logits = torch.randn(3, V)
    narrowed = ConstraintMasker(V, 3)(logits, seqs)
    assert isinstance(narrowed, Narrowed) and list(narrowed) == [0, 1, 2]
    if rows_routine() is None:
        assert narrowed.picker is None
    else:
        routine, base, step, shape = narrowed.picker
        assert (routine, base, step, tuple(shape)) == (rows_routine(), logits.data_ptr(), V, (3, V))
    assert sample(logits, [GREEDY] * 3, [None] * 3, narrowed) == best(logits)
    assert settle(logits, [0] * 3, dict(narrowed)) == best(logits)  # a plain dict: settle() reads the logits
    strided = torch.randn(3, 2 * V)[:, ::2]  # [3, V], rows of stride 2
    narrowed = ConstraintMasker(V, 3)(strided, seqs)
    assert list(narrowed) == [0, 1, 2] and narrowed.picker is None
    assert sample(strided, [GREEDY] * 3, [None] * 3, narrowed) == best(strided)
    doubles = torch.randn(3, V, dtype=torch.float64)
    assert ConstraintMasker(V, 3)(doubles, seqs) == {}
    assert all(torch.isfinite(doubles[row]).nonzero().view(-1).tolist() == [3, 5] for row in range(3))


@pytest.mark.parametrize("banned_first", [True, False])
def test_a_greedy_row_with_a_banned_list_takes_its_own_argmax_unless_banned(banned_first):
    logits = torch.randn(3, V)
    top = int(logits[1].argmax())
    logits[1, top + 1] = logits[1, top]  # a tie: the first of equal maxima wins, as over the masked row
    banned = [7, top] if banned_first else [7, top + 2]
    reference = logits.clone()
    reference[1, banned] = float("-inf")
    mask = SparseMask(False, torch.tensor(sorted(banned)), V)
    params = [GREEDY, GREEDY, SAMPLED]
    generators = [None, None, SAMPLED.make_generator()]
    expected = [int(logits[0].argmax()), int(reference[1].argmax())]
    assert expected[1] == (top + 1 if banned_first else top)
    assert sample(logits, params, generators, {1: mask})[:2] == expected


def test_terminated_matcher_allows_nothing():
    grammar = shared_compiler().compile_json_schema({"enum": ["yes"]})
    matcher = grammar.matcher()
    for token in smollm2_tokenizer().encode('"yes"', add_special_tokens=False):
        matcher.advance(token)
    assert matcher.finished()
    eos = min(smollm2_vocabulary().eos_token_ids)
    logits = torch.randn(3, V)
    reference, fast = masked_both_ways(logits, [None, matcher, None])
    assert torch.equal(reference, fast) and torch.isfinite(fast[1, eos])
    matcher.advance(eos)
    assert matcher.sparse_mask() is grammar.nothing_allowed
    reference, fast = masked_both_ways(logits, [None, matcher, None])
    assert torch.equal(reference, fast) and not torch.isfinite(fast[1]).any()


def test_tool_constraint_fast_path_equals_bitmask_path():
    """Auto mode: free text under the trigger's masks (banned ids), then the call grammar."""
    tools = [{"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}]
    grammar = tool_grammar("hermes", tools, schema_to_regex, False, None)
    tokenizer, vocab = smollm2_tokenizer(), smollm2_vocabulary()
    constraint = compile_tool_constraint(grammar, shared_compiler(), tokenizer, required=False,
                                         trigger=trigger_masks(vocab, grammar.trigger, ()))
    assert constraint.sparse_mask().allowed is False  # free text: the few overrunning tokens banned
    for token in tokenizer.encode("Sure. <tool_call>", add_special_tokens=False):
        constraint.advance(token)
    kinds, _ = walk_and_compare(constraint, seed=7)
    assert "allowed" in kinds and constraint.calls_opened == 1


def test_sparse_mask_picks_the_short_side_and_ignores_bits_past_the_vocabulary():
    row = torch.zeros(3, dtype=torch.int32)  # 96 bits for a 70-token vocabulary
    row[0], row[2] = 0b1001, -1  # tokens 0, 3 and the bits of 64..95 (66..95 are past the end)
    sparse = sparse_mask(row, 70)
    assert sparse.allowed and sparse.ids.tolist() == [0, 3, 64, 65, 66, 67, 68, 69]
    row.fill_(-1)
    row[1] = ~(1 << 4)  # all but token 36
    sparse = sparse_mask(row, 70)
    assert not sparse.allowed and sparse.ids.tolist() == [36] and sparse.vocab_size == 70
    assert sparse_mask(HalfMask().row, V) is None


@pytest.mark.parametrize("allowed,ids", [(True, [7]), (True, [1, 5, 9]), (False, [7]), (False, [2, 3]), (True, [])])
def test_a_mask_of_sorted_ids_is_the_one_the_constructor_makes(allowed, ids):
    array = np.array(ids, dtype=np.int64)
    held, made = SparseMask.of_sorted(allowed, array, 10), SparseMask(allowed, array, 10)
    assert held.array is array  # held as it is, no copy
    for slot in ("allowed", "vocab_size", "size", "single", "address"):
        assert getattr(held, slot) == getattr(made, slot)
    assert held.ids.tolist() == ids


def test_apply_sparse_mask_refuses_a_row_of_another_width():
    sparse = SparseMask(True, torch.tensor([1, 2]), 10)
    with pytest.raises(ValueError, match="one CPU logits row"):
        apply_sparse_mask_inplace(torch.zeros(2, 10), sparse)
    row = torch.arange(10, dtype=torch.bfloat16)
    apply_sparse_mask_inplace(row, sparse)
    assert torch.isfinite(row).nonzero().view(-1).tolist() == [1, 2] and row[2] == 2


@pytest.mark.parametrize("count", [0, 1, 700, 8000, V])
def test_set_bits_in_c_and_numpy_equal_the_bits(count, monkeypatch):
    """Through the extension, through ctypes (no Python headers) and in numpy (no C compiler)."""
    from grammars.index import native
    from grammars.masks import sparse_mask as module

    bits = np.zeros(V, dtype=bool)
    bits[np.random.default_rng(count).choice(V, count, replace=False)] = True
    words = np.packbits(bits, bitorder="little").view(np.uint32)
    expected = np.flatnonzero(bits).tolist()
    assert native.extension() is not None and module._set_bits_by_ctypes() is not None  # both built here
    assert module._set_bits(words).tolist() == expected
    monkeypatch.setattr(native, "extension", lambda: None)  # no Python headers: ctypes
    assert module._set_bits(words).tolist() == expected
    monkeypatch.setattr(native, "routine", lambda *args: None)  # no C compiler: numpy
    assert module._set_bits(words).tolist() == expected


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("way", ["extension", "ctypes", "numpy"])
def test_id_list_forms_made_without_a_row_equal_the_rows_conversion(seed, way, monkeypatch):
    """allowed_sparse (ids in any order, repeated) and changed (a mask less some ids, plus others) give
    what sparse_mask gives of the row, or None exactly where that is not the side they keep (or more
    than ALLOWED_MAX ids are given to allowed_sparse, repeats counted); over
    short and long sides, near each side's cap, on a 49k and a 600-token vocabulary; merged in C
    (grammars/index/_merge_ids.c) through the extension, through ctypes (no Python headers) and, as
    without a C compiler, in numpy."""
    from grammars.index import native
    from grammars.index.budget import ALLOWED_MAX, DISALLOWED_MAX
    from grammars.masks.sparse_mask import allowed_sparse, changed

    if way != "numpy" and native.library() is None:
        pytest.skip("no C compiler here")
    if way == "extension":
        assert native.extension() is not None
    else:
        monkeypatch.setattr(native, "extension", lambda: None)
    if way == "numpy":
        monkeypatch.setattr(native, "routine", lambda *args: None)

    rng = np.random.default_rng(seed)
    made = {True: 0, False: 0}
    for size in (V, 600):
        for count in (0, 3, 300, ALLOWED_MAX - 5, ALLOWED_MAX + 5, size - DISALLOWED_MAX - 5, size - 700, size - 3):
            if not 0 <= count <= size:
                continue
            ids = rng.choice(size, count, replace=False)
            base = sparse_mask(_row_of(ids, size), size)
            given = np.concatenate((ids, ids[:count // 3]))
            _same(allowed_sparse(given, size), base, only=True if len(given) <= ALLOWED_MAX else None)
            on, off = rng.choice(size, 40, replace=False), rng.choice(size, 3, replace=False)
            kept = np.union1d(np.setdiff1d(ids, off), on)
            got = changed(base, on, off)
            _same(got, sparse_mask(_row_of(kept, size), size), only=base.allowed if base is not None else None)
            if got is not None:
                made[got.allowed] += 1
    assert made[True] and made[False]


def _row_of(ids, size):
    bits = np.zeros((size + 31) // 32 * 32, dtype=bool)
    bits[ids] = True
    return torch.from_numpy(np.packbits(bits, bitorder="little").view(np.int32).copy())


def _same(got, expected, only):
    """got equals expected where expected keeps the side ``only`` (None: no side), else got is None."""
    if expected is None or only is None or expected.allowed != only:
        assert got is None
        return
    assert got is not None and got.allowed == expected.allowed and np.array_equal(got.array, expected.array)


@pytest.mark.parametrize("allowed", [True, False])
def test_few_ids_merge_in_python_as_in_c(allowed, monkeypatch):
    """_merged below _FEW_IDS ids in all without the extension (Python's sets) gives what the C merge
    and the numpy merge give above it, and the extension's merge at any size: ascending, distinct;
    ``on`` and ``off`` repeated, overlapping, lists or arrays."""
    from grammars.index import native
    from grammars.masks import sparse_mask as module

    rng = np.random.default_rng(int(allowed))
    for trial in range(300):
        ids = np.unique(rng.integers(0, 90, rng.integers(0, 40)))
        on, off = rng.integers(0, 90, rng.integers(0, 12)), rng.integers(0, 90, rng.integers(0, 12))
        on = on.tolist() if trial % 2 else on
        if len(ids) + len(on) + len(off) > module._FEW_IDS:
            continue
        expected = sorted((set(ids.tolist()) - set(off.tolist())) | set(np.asarray(on).tolist()) if allowed
                          else (set(ids.tolist()) | set(off.tolist())) - set(np.asarray(on).tolist()))
        got = module._merged(ids, allowed, on, off)  # through the extension
        assert got.dtype == np.int64 and got.tolist() == expected
        monkeypatch.setattr(native, "extension", lambda: None)  # no Python headers: Python's sets
        got = module._merged(ids, allowed, on, off)
        assert got.dtype == np.int64 and got.tolist() == expected
        monkeypatch.setattr(module, "_FEW_IDS", -1)  # the same merge by ctypes (or numpy without a compiler)
        assert module._merged(ids, allowed, on, off).tolist() == expected
        monkeypatch.undo()


@pytest.mark.parametrize("allowed", [True, False])
def test_long_unsorted_edits_merge_alike_every_way(allowed, monkeypatch):
    """_merged with long unsorted, repeated ``on`` and ``off`` (int64 and int32 arrays, lists; the C
    merge sorts those by a bitmap) gives the same ascending distinct ids through the extension, through
    ctypes and in numpy."""
    from grammars.index import native
    from grammars.masks import sparse_mask as module

    if native.library() is None:
        pytest.skip("no C compiler here")
    rng = np.random.default_rng(5 + int(allowed))
    for trial in range(40):
        ids = np.unique(rng.integers(0, V, rng.integers(0, 3000)))
        on, off = rng.integers(0, V, rng.integers(0, 900)), rng.integers(0, V, rng.integers(60, 900))
        on = [on, on.astype(np.int32), on.tolist()][trial % 3]
        listed = np.asarray(on).tolist()
        expected = sorted((set(ids.tolist()) - set(off.tolist())) | set(listed) if allowed
                          else (set(ids.tolist()) | set(off.tolist())) - set(listed))
        assert module._merged(ids, allowed, on, off).tolist() == expected
        monkeypatch.setattr(native, "extension", lambda: None)  # no Python headers: ctypes
        assert module._merged(ids, allowed, on, off).tolist() == expected
        monkeypatch.setattr(native, "routine", lambda *args: None)  # no C compiler: numpy
        assert module._merged(ids, allowed, on, off).tolist() == expected
        monkeypatch.undo()
