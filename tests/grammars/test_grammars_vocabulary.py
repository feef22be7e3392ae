"""TokenVocabulary: token bytes round-trip through the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

from grammar_fixtures import SMOLLM2_VOCAB_SIZE, smollm2_tokenizer, smollm2_vocabulary
from grammars import TokenVocabulary

SAMPLES = [
    'Hello world\n\n  {"a": 1, "b": [true, null]}',
    "héllo 🎉 日本語\ttab — “quotes” ñ",
    "\r\n    indented\n\tcode();  // comment",
    "emoji sequence 👩‍👩‍👧 and math ∑∫√",
]


@pytest.fixture(scope="module")
def vocab():
    return smollm2_vocabulary()


def test_detects_byte_level(vocab):
    assert vocab.kind == "byte_level"
    assert vocab.size == SMOLLM2_VOCAB_SIZE


@pytest.mark.parametrize("text", SAMPLES)
def test_token_bytes_round_trip(vocab, text):
    tok = smollm2_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    assert vocab.decode(ids).decode("utf-8") == tok.decode(ids) == text


def test_partial_utf8_tokens_kept_as_bytes(vocab):
    """Tokens that are one byte of a multi-byte character are usable on their own."""
    partial = [t for t, b in vocab.token_bytes.items() if len(b) == 1 and b[0] >= 0x80]
    assert len(partial) >= 64
    with pytest.raises(UnicodeDecodeError):
        vocab.token_bytes[partial[0]].decode("utf-8")


def test_special_and_eos(vocab):
    tok = smollm2_tokenizer()
    assert tok.eos_token_id in vocab.eos_token_ids
    assert set(tok.all_special_ids) <= vocab.special_ids
    assert not vocab.special_ids & set(vocab.token_bytes)  # never text


def test_fingerprint_stable_and_sensitive():
    tok = smollm2_tokenizer()
    a = TokenVocabulary.from_tokenizer(tok, SMOLLM2_VOCAB_SIZE)
    b = TokenVocabulary.from_tokenizer(tok, SMOLLM2_VOCAB_SIZE)
    c = TokenVocabulary.from_tokenizer(tok, SMOLLM2_VOCAB_SIZE, extra_eos_token_ids=(0,))
    assert a.fingerprint == b.fingerprint != c.fingerprint


class _FakeSentencePiece:
    """A minimal slow-tokenizer stand-in with SentencePiece pieces."""

    eos_token_id = 2
    all_special_ids = [0, 1, 2]
    added_tokens_decoder: dict = {}

    def get_vocab(self):
        return {"<unk>": 0, "<s>": 1, "</s>": 2, "▁hello": 3, "▁": 4, "<0xE2>": 5,
                "<0x82>": 6, "<0xAC>": 7, "world": 8, "▁▁": 9}


def test_sentencepiece_pieces():
    vocab = TokenVocabulary.from_tokenizer(_FakeSentencePiece(), 16)
    assert vocab.kind == "sentencepiece"
    assert vocab.token_bytes[3] == b" hello"
    assert vocab.token_bytes[9] == b"  "
    assert vocab.decode([5, 6, 7]).decode() == "€"
    assert {0, 1, 2} <= vocab.special_ids
