"""TokenIndex: a unit's token-level automaton in plain arrays; IndexCursor: a request's place in it.

States are numbered 0 .. n-1 in breadth-first order from the initial state 0. Per state: whether it
is final (EOS is accepted there; EOS is never a transition), whether it is a *loop state* (inside a
JSON string: every plain token leads back to it, grammars/index/plain_tokens.py), and its explicit
transitions as CSR arrays with ascending token ids. A loop state lists only its non-plain tokens
(a few hundred), not ~50k-260k pairs, so a unit is small to build, send, store and load.

It answers the part of outlines-core's Index API that maskd uses (``get_next_state``,
``is_final_state``, ``get_allowed_tokens``, ``get_transitions`` ...); the plain tokens come from the
vocabulary (``attach``), not from the arrays, so a pickled or saved index carries the arrays alone.
A state's transitions become a dict on its first lookup (a few hundred entries for most states).
"""

from __future__ import annotations

import numpy as np

from grammars.index.plain_tokens import PlainTokens

NO_TOKEN = -1  # no single token (a state that allows none or several)
_DICT_MAX = 1024  # a state's transitions become a dict up to this many, else they are searched
_BIG = object()  # marks a state searched in its arrays


class TokenIndex:
    """Immutable arrays of one unit's index (see the module docstring)."""

    __slots__ = ("final", "loop", "off", "tok", "nxt", "plain", "_final", "_loop", "_member", "_rows")

    def __init__(self, final, loop, off, tok, nxt, plain: PlainTokens | None = None) -> None:
        self.final = np.asarray(final, dtype=np.uint8)  # [S]
        self.loop = np.asarray(loop, dtype=np.uint8)  # [S]
        self.off = np.asarray(off, dtype=np.int64)  # [S + 1]
        self.tok = np.asarray(tok, dtype=np.int32)  # [T] ascending within a state
        self.nxt = np.asarray(nxt, dtype=np.int32)  # [T]
        self._final, self._loop = self.final.tobytes(), self.loop.tobytes()  # fast per-state reads
        self._rows: list[dict[int, int] | None] = [None] * len(self.final)
        self.plain, self._member = None, b""
        if plain is not None:
            self.attach(plain)

    def attach(self, plain: PlainTokens) -> "TokenIndex":
        """Give the index its vocabulary's plain tokens (once: an index arrives without them)."""
        if self.plain is None:
            self.plain, self._member = plain, plain.member
        elif self.plain is not plain:
            raise ValueError("this index already has another vocabulary's plain tokens")
        return self

    def __reduce__(self):
        return TokenIndex, (self.final, self.loop, self.off, self.tok, self.nxt)

    @property
    def n_states(self) -> int:
        return len(self._final)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.final, self.loop, self.off, self.tok, self.nxt))

    def get_initial_state(self) -> int:
        return 0

    def is_final_state(self, state: int) -> bool:
        return self._final[state] == 1

    def get_final_states(self) -> list[int]:
        return np.flatnonzero(self.final).tolist()

    def is_loop_state(self, state: int) -> bool:
        return self._loop[state] == 1

    def explicit(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, next states) listed for ``state`` (a loop state's plain tokens are not)."""
        lo, hi = self.off[state], self.off[state + 1]
        return self.tok[lo:hi], self.nxt[lo:hi]

    def get_next_state(self, state: int, token: int) -> int | None:
        row = self._rows[state]
        if row is None:
            tokens, following = self.explicit(state)
            row = self._rows[state] = dict(zip(tokens.tolist(), following.tolist())) if len(tokens) <= _DICT_MAX \
                else _BIG
        if row is _BIG:  # a long list: searched, not copied into a dict (~70 bytes an entry)
            tokens, following = self.explicit(state)
            at = int(np.searchsorted(tokens, token))
            found = int(following[at]) if at < len(tokens) and tokens[at] == token else None
        else:
            found = row.get(token)
        if found is None and self._loop[state] and token < len(self._member) and self._member[token]:
            return state
        return found

    def get_allowed_tokens(self, state: int) -> list[int]:
        """Every token allowed in ``state`` (ascending; EOS not included)."""
        tokens = self.explicit(state)[0]
        if self._loop[state]:
            tokens = np.union1d(tokens, self.plain.ids)
        return tokens.tolist()

    def get_transitions(self) -> dict[int, dict[int, int]]:
        """Every state's transitions, plain ones included (tests and the slow paths)."""
        out = {}
        for state in range(self.n_states):
            tokens, following = self.explicit(state)
            row = dict(zip(tokens.tolist(), following.tolist()))
            if self._loop[state]:
                row.update(dict.fromkeys(self.plain.ids.tolist(), state))
            out[state] = dict(sorted(row.items()))
        return out

    def successors(self, labels: dict[int, int]) -> dict[int, dict[int, int]]:
        """{state: {label: next state}} for the tokens of ``labels`` (token -> label, such as one-byte
        tokens by their byte; labels are >= 0) over every state at once, plain ones of loop states included."""
        out: dict[int, dict[int, int]] = {state: {} for state in range(self.n_states)}
        if not labels:
            return out
        lookup = np.full(max(labels) + 1, -1, dtype=np.int64)
        lookup[list(labels)] = list(labels.values())
        owner = np.repeat(np.arange(self.n_states), np.diff(self.off))  # [T] the state of each transition
        hit = np.flatnonzero(self.tok < len(lookup))
        hit = hit[lookup[self.tok[hit]] >= 0]
        for state, label, following in zip(owner[hit].tolist(), lookup[self.tok[hit]].tolist(),
                                            self.nxt[hit].tolist()):
            out[state][label] = following
        plain = [label for token, label in labels.items() if token < len(self._member) and self._member[token]]
        for state in np.flatnonzero(self.loop).tolist():
            out[state].update(dict.fromkeys(plain, state))
        return out

    def fill_words(self, state: int, words: np.ndarray) -> None:
        """Write ``state``'s tokens below the logits width into ``words`` (uint32, packed; EOS not set)."""
        tokens = self.explicit(state)[0]
        tokens = tokens[tokens < 32 * len(words)]
        if len(tokens) > 256:  # a long list: scattered into bytes and packed (3x np.bitwise_or.at's speed)
            bits = np.zeros(32 * len(words), dtype=np.bool_)
            bits[tokens] = True
            np.copyto(words, np.packbits(bits, bitorder="little").view(np.uint32))
        else:
            words.fill(0)
            tokens = tokens.astype(np.int64)
            np.bitwise_or.at(words, tokens >> 5, np.left_shift(np.uint32(1), (tokens & 31).astype(np.uint32)))
        if self._loop[state]:
            words |= self.plain.words


class IndexCursor:
    """A request's state in a TokenIndex, with the last ``max_rollback`` steps kept for rollback."""

    __slots__ = ("index", "_trail", "_limit")

    def __init__(self, index: TokenIndex, max_rollback: int) -> None:
        self.index, self._trail, self._limit = index, [0], max_rollback

    def get_state(self) -> int:
        return self._trail[-1]

    def advance(self, token: int, _return_tokens: bool = False) -> None:
        """Step over ``token``; ValueError if the state does not allow it."""
        trail = self._trail
        following = self.index.get_next_state(trail[-1], token)
        if following is None:
            raise ValueError(f"token {token} is not allowed in state {trail[-1]}")
        trail.append(following)
        if len(trail) > 2 * self._limit + 2:  # keep the last max_rollback steps, trimmed in batches
            del trail[: len(trail) - self._limit - 1]

    def rollback_state(self, n: int) -> None:
        if n > len(self._trail) - 1:
            raise ValueError(f"cannot roll back {n} steps: {len(self._trail) - 1} are kept")
        if n:
            del self._trail[-n:]

    def reset(self) -> None:
        self._trail = [0]

    def place(self, state: int) -> None:
        """Start over at ``state`` (nothing to roll back)."""
        self._trail = [state]


def from_outlines(index, eos_token_id: int) -> TokenIndex:
    """An outlines_core.Index as a TokenIndex (no loop states; EOS transitions dropped): where the trie
    walk cannot build the index (no C compiler, or the regex holds its sentinel byte)."""
    transitions, finals = index.get_transitions(), set(index.get_final_states())
    number, order = {index.get_initial_state(): 0}, [index.get_initial_state()]
    off, tok, nxt = [0], [], []
    for state in order:
        for token, following in sorted(transitions.get(state, {}).items()):
            if token == eos_token_id:
                continue
            if following not in number:
                number[following] = len(order)
                order.append(following)
            tok.append(token)
            nxt.append(number[following])
        off.append(len(tok))
    final = [state in finals for state in order]
    return TokenIndex(final, np.zeros(len(order)), off, tok, nxt)
