"""A vocabulary and the token-level automata built over it: TokenVocabulary (token id -> bytes), the
plain tokens, a unit's TokenIndex and IndexCursor, the token trie walk that builds it (token_index),
its BudgetTable (fewest tokens to acceptance), and the C routines on plain arrays (native, _*.c).
"""
