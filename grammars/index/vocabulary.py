"""TokenVocabulary: the per-model view of a tokenizer as token id -> bytes.

Built once per model.  Handles byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM: the
byte-level unicode alphabet maps back to raw bytes) and SentencePiece vocabularies
(``▁`` is a space, ``<0xNN>`` tokens are single bytes).  Tokens whose bytes are not
valid UTF-8 on their own are kept as raw bytes: ``outlines_core.Vocabulary`` accepts
``bytes`` keys and matches them byte by byte against the regex automaton.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

import outlines_core

from grammars.errors import GrammarError

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CONTROL_LOOKING = re.compile(r"^(<[^<>\s]+>|\[[A-Z_]+\]|<\|[^|]*\|>)$")
_SPIECE_SPACE = "\u2581"  # ▁
_GPT2_SPACE = "\u0120"  # Ġ


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table, inverted: printable char -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_BYTE_LEVEL = _byte_level_decoder()


def _decoder_types(tokenizer) -> set[str]:
    """Types of the fast tokenizer's decoder components (empty for slow tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    spec = json.loads(backend.to_str()).get("decoder") or {}
    parts = spec.get("decoders", [spec]) if spec.get("type") == "Sequence" else [spec]
    return {p.get("type", "") for p in parts if p}


def detect_kind(tokenizer, pieces: dict[str, int]) -> str:
    """'byte_level' or 'sentencepiece', from the decoder, else from the token alphabet."""
    types = _decoder_types(tokenizer)
    if "ByteLevel" in types:
        return "byte_level"
    if types & {"Metaspace", "ByteFallback", "Replace"}:
        return "sentencepiece"
    sp = sum(1 for p in pieces if p.startswith(_SPIECE_SPACE))
    bl = sum(1 for p in pieces if p.startswith(_GPT2_SPACE))
    return "sentencepiece" if sp > bl else "byte_level"


def _piece_bytes(piece: str, kind: str) -> bytes:
    if kind == "byte_level":
        try:
            return bytes(_BYTE_LEVEL[c] for c in piece)
        except KeyError as e:
            raise GrammarError(
                f"token {piece!r} has character {e.args[0]!r} outside the byte-level "
                f"alphabet; the tokenizer is not byte-level BPE, pass a SentencePiece or "
                f"byte-level tokenizer"
            ) from None
    m = _BYTE_FALLBACK.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace(_SPIECE_SPACE, " ").encode("utf-8")


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """Token id -> bytes for one model, plus the ids that may never appear in text."""

    size: int  # logits width (may exceed len(tokenizer))
    eos_token_ids: frozenset[int]
    special_ids: frozenset[int]
    token_bytes: dict[int, bytes] = field(repr=False)  # text tokens only
    kind: str  # "byte_level" | "sentencepiece"
    fingerprint: str
    outlines: outlines_core.Vocabulary = field(repr=False)

    @property
    def eos_token_id(self) -> int:
        """The EOS id outlines-core's index allows in final states."""
        return min(self.eos_token_ids)

    @classmethod
    def from_tokenizer(
        cls, tokenizer, vocab_size: int, extra_eos_token_ids: tuple[int, ...] = ()
    ) -> "TokenVocabulary":
        """Build from a Hugging Face tokenizer; ``vocab_size`` is the model's logits width."""
        if tokenizer.eos_token_id is None and not extra_eos_token_ids:
            raise GrammarError(
                "the tokenizer has no eos_token_id; pass extra_eos_token_ids=(id, ...) "
                "naming the token(s) that end a generation"
            )
        eos = {int(i) for i in extra_eos_token_ids}
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        pieces: dict[str, int] = tokenizer.get_vocab()
        kind = detect_kind(tokenizer, pieces)

        special = {int(i) for i in tokenizer.all_special_ids}
        added_text: dict[int, bytes] = {}
        for tid, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
            content = getattr(added, "content", str(added))
            if getattr(added, "special", True) or _CONTROL_LOOKING.match(content):
                special.add(int(tid))
            else:  # added plain text (e.g. runs of spaces): stored verbatim
                added_text[int(tid)] = content.encode("utf-8")
        special |= eos

        token_bytes: dict[int, bytes] = {}
        for piece, tid in pieces.items():
            if tid in special or tid >= vocab_size:
                continue
            token_bytes[tid] = added_text.get(tid) or _piece_bytes(piece, kind)
        token_bytes = {t: b for t, b in token_bytes.items() if b}

        by_bytes: dict[bytes, list[int]] = {}
        for tid, b in token_bytes.items():
            by_bytes.setdefault(b, []).append(tid)
        primary_eos = min(eos)
        digest = hashlib.sha256(f"{kind}|{vocab_size}|{sorted(eos)}|".encode())
        for tid in sorted(token_bytes):
            digest.update(tid.to_bytes(4, "little") + len(token_bytes[tid]).to_bytes(2, "little"))
            digest.update(token_bytes[tid])
        return cls(
            size=int(vocab_size),
            eos_token_ids=frozenset(eos),
            special_ids=frozenset(special),
            token_bytes=token_bytes,
            kind=kind,
            fingerprint=digest.hexdigest(),
            outlines=outlines_core.Vocabulary(primary_eos, by_bytes),
        )

    def decode(self, token_ids: list[int]) -> bytes:
        """Concatenated bytes of text tokens (special tokens contribute nothing)."""
        return b"".join(self.token_bytes.get(t, b"") for t in token_ids)
