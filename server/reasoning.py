"""Thinking text (`<think>...</think>`) split from the answer, as reasoning models write it.

A model such as Qwen3 or DeepSeek-R1 opens its answer with a thinking block; its chat template may
already have opened it in the prompt (then the output starts inside it). The splitter is fed the
output piece by piece and returns (reasoning, answer) text; a piece that could be the start of a
tag is held back until the next piece decides it, so the same text split anywhere gives the same
result. Only a block at the very start counts: `<think>` later in an answer is plain text.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ReasoningSplitter:
    def __init__(self, starts_inside: bool = False):
        self._state = "inside" if starts_inside else "start"  # start | inside | after | answer
        self._held = ""

    @staticmethod
    def opened_in(prompt_text: str) -> bool:
        """Whether the prompt leaves a thinking block open (the template wrote `<think>` last)."""
        return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, answer) of this piece; at `final` nothing stays held."""
        text, self._held = self._held + text, ""
        reasoning = ""
        if self._state == "start":
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                self._state, text = "inside", stripped[len(OPEN):]
            elif OPEN.startswith(stripped) and not final:  # maybe a tag still being written
                self._held = text
                return "", ""
            else:
                self._state = "answer"
        if self._state == "inside":
            end = text.find(CLOSE)
            if end >= 0:
                reasoning, text = text[:end], text[end + len(CLOSE):]
                self._state = "after"
            else:
                keep = _partial_suffix(text, CLOSE) if not final else 0
                reasoning, self._held = text[:len(text) - keep], text[len(text) - keep:]
                return reasoning, ""
        if self._state == "after":  # the blank lines after </think> belong to neither
            text = text.lstrip("\n")
            if text:
                self._state = "answer"
        return reasoning, text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
