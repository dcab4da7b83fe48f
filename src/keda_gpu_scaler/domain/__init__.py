"""Pure domain: sample types, metric catalog, profiles, trigger parsing, decisions.

Nothing here performs I/O or reads a clock; time is always passed in.
"""
