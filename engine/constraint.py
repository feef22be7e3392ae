"""Constraint: what the engine asks of a request's constraint, every method of it (none is probed).

grammars/ builds them (grammars.Matcher for an output format, ToolCallConstraint for tool calls;
both through the GrammarCompiler facade); the engine drives one per row. The compiled units behind
a constraint are shared read-only by every row and request; the constraint holds one row's state.

A budget is the number of tokens the request may still generate, the next one included: the
constraint then allows only tokens after which its output can still close within it, and
`budget_forced` tells whether that ever narrowed a mask; `closed()` whether stopping now cuts
nothing (then running out of budget ends the request with "stop", not "length").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from grammars.masks.sparse_mask import SparseMask


@runtime_checkable
class Constraint(Protocol):
    budget_forced: bool  # a token budget narrowed a mask at least once (usage reports it)

    def ready(self) -> bool:
        """Whether it can mask its next token now (its units compiled); the row waits until then."""

    def fill(self, row: torch.Tensor, budget: int | None = None) -> None:
        """Writes the tokens allowed next into a bitmask row (int32 [W]); with `budget`, only those
        after which the output can still close within that many tokens."""

    def sparse_mask(self, budget: int | None = None) -> SparseMask | None:
        """The allowed tokens as a SparseMask where it has one that fits (no fill then), else None."""

    def advance(self, token_id: int) -> None:
        """Takes the token the row appended; a token it does not allow raises."""

    def rollback(self, n: int) -> None:
        """Undoes the last n advances (forced text tries a run, then steps back)."""

    def forced(self) -> list[int]:
        """The tokens that must come next, one choice each (possibly none)."""

    def free_text(self) -> bool:
        """Whether the row writes free text now: stop strings and stop tokens apply only there (a
        tool call or a structured output is never cut by them)."""

    def closed(self) -> bool:
        """Whether the output so far is complete and valid (a budget end there is a stop)."""

    def is_terminated(self) -> bool:
        """Whether the output has ended (EOS taken or nothing may follow)."""

    def min_tokens(self) -> int:
        """The fewest tokens that still close the output."""
