"""Exceptions raised by the kvstore package."""

from __future__ import annotations


class PoolIntegrityError(RuntimeError):
    """A block pool invariant is broken: a bookkeeping bug, never a user error."""
