"""The change journal: fanotify tells which directories of the layer changed.

Concepts:
    - ``fanotify.py``: the binding (ctypes) and the decoder of event records.
    - ``journal.py``: :class:`Journal`, which watches the layer's file system and, at each
      capture, hands the capture a :class:`~sprite_env.snapshot.capture.WalkHint` (the
      dirty directories since the previous capture) or a reason to walk everything.

Invariant: the journal is a hint, never the truth. A capture it drives yields the top tree
a full walk of the same state yields; what the journal cannot vouch for makes the capture
walk everything, which costs time, never a file (the argument is in
``snapshot/capture.py``).
"""

from sprite_env.journal.journal import (
    OVERLAY_MIN_KERNEL,
    ChangeJournal,
    Epoch,
    Journal,
    JournalUnavailable,
    NoJournal,
    WalkPlan,
    kernel_reason,
    open_epoch,
    open_journal,
    probe,
)

__all__ = [
    "OVERLAY_MIN_KERNEL",
    "ChangeJournal",
    "Epoch",
    "Journal",
    "JournalUnavailable",
    "NoJournal",
    "WalkPlan",
    "kernel_reason",
    "open_epoch",
    "open_journal",
    "probe",
]
