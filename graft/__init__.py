"""GRAFT: cross-model trajectory exchange for RLVR."""

__version__ = "0.1.0"
