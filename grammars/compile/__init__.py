"""Compiling units: GrammarCompiler (regex / JSON schema -> CompiledGrammar, cached in memory and on
disk), its killable worker processes and their turns, shared futures, background work, its memory
and the unit file format.
"""
