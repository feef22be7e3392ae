"""Incremental detokenization with stop strings: token ids in, text deltas safe to show out."""

from __future__ import annotations

_PROMPT_TAIL = 6  # prompt tokens decoded along with the first outputs, so leading spaces survive


class Detokenizer:
    """Turns one request's tokens into text deltas; a delta never ends inside a UTF-8 character."""

    def __init__(self, tokenizer, prompt_ids: list[int], keep_special_ids: frozenset[int] = frozenset()):
        """Special tokens are left out of the text, except keep_special_ids (e.g. tool-call delimiters)."""
        self._tokenizer = tokenizer
        self._drop = frozenset(tokenizer.all_special_ids) - keep_special_ids if keep_special_ids else None
        self._ids = list(prompt_ids[-_PROMPT_TAIL:])
        self._prefix = 0  # start of the window decoded for context
        self._read = len(self._ids)  # end of what was already returned

    def _decode(self, ids: list[int]) -> str:
        if self._drop is None:
            return self._tokenizer.decode(ids, skip_special_tokens=True)
        return self._tokenizer.decode([i for i in ids if i not in self._drop], skip_special_tokens=False)

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # an incomplete character, or a token with no text: wait for more
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]


class StopStrings:
    """Holds back text that could begin a stop string; reports the text before the first stop."""

    def __init__(self, stops: list[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def feed(self, delta: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped). On a stop, ``matched`` is the stop found earliest in
        the text (of two starting at the same place, the first listed)."""
        if not self._stops:
            return delta, False
        text = self._held + delta
        hits = [(i, n) for n, i in enumerate(text.find(s) for s in self._stops) if i >= 0]
        if hits:
            start, n = min(hits)
            self._held = ""
            self.matched = self._stops[n]
            return text[:start], True
        keep = 0
        for stop in self._stops:  # longest suffix of text that is a proper prefix of a stop
            for n in range(min(len(stop) - 1, len(text)), keep, -1):
                if text.endswith(stop[:n]):
                    keep = n
                    break
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        """At the end of generation the held text was no stop after all."""
        held, self._held = self._held, ""
        return held
