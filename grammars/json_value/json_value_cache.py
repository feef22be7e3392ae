"""The one JsonValueAutomaton per vocabulary (grammars/json_value/json_value.py): built once per process, its
tables read from and written to the disk cache (``cache_dir``), its masks made ahead (warm_json),
shared by every request."""

from __future__ import annotations

import hashlib
import logging
import os
import threading

from grammars.files.cache_version import JSON_VALUE_VERSION
from grammars.json_value.json_value import JsonValueAutomaton
from grammars.json_value.json_value_lexer import ARRAY, NUM_STATES, OBJECT
from grammars.json_value.json_value_tables import JsonValueTables, build_tables, load_tables, save_tables
from grammars.files.private_dir import owned_file, private_dir
from grammars.index.vocabulary import TokenVocabulary

log = logging.getLogger("maskd.grammars")

# warm_automaton(): stacks of one container type repeated up to this deep (models nest `{"type":` keys)
WARM_REPEATED = 24
_AUTOMATA: dict[str, JsonValueAutomaton] = {}
_BUILDING: dict[str, threading.Lock] = {}
_LOCK = threading.Lock()


def json_value_automaton(vocabulary: TokenVocabulary, cache_dir: str | None = None) -> JsonValueAutomaton:
    """The one shared automaton of ``vocabulary`` (memory cache; tables on disk in ``cache_dir``)."""
    key = vocabulary.fingerprint
    got = _AUTOMATA.get(key)
    if got is not None:
        return got
    with _LOCK:
        lock = _BUILDING.setdefault(key, threading.Lock())
    with lock:  # one build per vocabulary, others wait for it
        got = _AUTOMATA.get(key)
        if got is None:
            tables = _disk_tables(vocabulary, cache_dir)
            got = _AUTOMATA[key] = JsonValueAutomaton(tables, vocabulary.eos_token_ids, key)
    return got


def forget(vocabulary: TokenVocabulary) -> None:
    """Drop the process's automaton of ``vocabulary``: the next json_value_automaton() makes a fresh
    one (benchmarks/mask_bench.py measures a server's first requests with it)."""
    _AUTOMATA.pop(vocabulary.fingerprint, None)


def warm_json(automaton: JsonValueAutomaton, vocabulary: TokenVocabulary, pause) -> None:
    """The automaton's masks and the vocabulary's free-value exits made ahead (grammars/json_value/value_exits.py;
    none where the vocabulary has no one-byte token for the holes' sentinel); ``pause()`` between two."""
    from grammars.errors import GrammarError
    from grammars.json_value.value_exits import value_exits

    warm_automaton(automaton, pause)
    try:
        exits = value_exits(vocabulary)
    except GrammarError:  # schemas compile without holes there
        return
    exits.warm(pause)


def warm_automaton(automaton: JsonValueAutomaton, pause=lambda: None) -> None:
    """Made ahead, as their first use would make them: every entry (a stack at most max_read deep
    holds every key), and the budget costs and budget-narrowed id lists of every stack at most
    max_read + max_pops + 1 deep (their keys read that many profiles) and of one type repeated
    deeper, the lists held under their budgets' keys (JsonValueAutomaton.make_budget_masks: 2,810
    keys on SmolLM2, 22,072 on Gemma 3): 0.15 s on SmolLM2, 0.9 s on Gemma 3, once per vocabulary.
    GrammarCompiler runs it once the automaton is loaded (`maskd serve` before it listens);
    ``pause()`` runs between two."""
    level, stacks = [()], [()]
    for _ in range(automaton.max_read + automaton.max_pops + 1):
        level = [stack + (kind,) for stack in level for kind in (OBJECT, ARRAY)]
        stacks += level
    stacks += [(kind,) * depth for kind in (OBJECT, ARRAY) for depth in range(len(level[0]) + 1, WARM_REPEATED)]
    for stack in stacks:
        frame = automaton.frame_of(stack)
        for q in range(NUM_STATES):
            pause()
            automaton.entry(q, frame)
            automaton.make_budget_masks(q, frame)


def _disk_tables(vocabulary: TokenVocabulary, cache_dir: str | None) -> JsonValueTables:
    path = None
    if cache_dir and private_dir(cache_dir):
        name = hashlib.sha256(f"{vocabulary.fingerprint}|json-value|{JSON_VALUE_VERSION}".encode()).hexdigest()
        path = os.path.join(cache_dir, f"json-value-{name[:32]}.npz")
        if owned_file(path):
            try:
                tables = load_tables(path)
                if tables.size == vocabulary.size:
                    return tables
                log.warning("%s is for a vocabulary of %d tokens, not %d; rebuilding", path, tables.size,
                            vocabulary.size)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("could not read %s (%s); rebuilding it", path, exc)
    tables = build_tables(vocabulary.token_bytes, vocabulary.size)
    if path:
        try:
            save_tables(tables, path)
        except OSError as exc:
            log.warning("could not write %s (%s); the JSON value tables stay in memory only", path, exc)
    return tables
