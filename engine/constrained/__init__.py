"""Constrained decoding of Hermes tool calls: a byte automaton (grammar.py), vocabulary bytes
(vocab.py), token masks (masks.py). Import from those modules: this package imports nothing, so
the chat layer can use the grammar without loading torch."""
