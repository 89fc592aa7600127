"""The paging errors. Out of blocks is a MemoryError a scheduler catches (to wait or preempt); the rest name a
caller's mistake about a sequence's state."""

from __future__ import annotations


class PagingError(Exception):
    """Base class of the block manager's errors."""


class OutOfBlocksError(PagingError, MemoryError):
    """Not enough free blocks: the scheduler catches this and preempts or waits."""

    def __init__(self, needed: int, free: int, what: str) -> None:
        super().__init__(f"{what}: needs {needed} free KV block(s), only {free} free")
        self.needed, self.free = needed, free


class RequestTooLongError(PagingError, MemoryError):
    """A request the whole cache could never hold: rejected, not queued (it would wait, or preempt, forever).

    A MemoryError like OutOfBlocksError (code that treats "not enough blocks" as MemoryError still does), but not
    an OutOfBlocksError: the scheduler catches that one to wait or preempt, which cannot help here."""


class UnknownSequenceError(PagingError, LookupError):
    """The sequence id was never allocated here, or was freed or preempted already."""


class FinishedSequenceError(PagingError):
    """The sequence finished (was freed); it can take no more tokens."""


class SwappedSequenceError(PagingError):
    """The sequence lives in the host pool (swapped out); swap it in before using it."""
