"""The log tailer: the one ordered writer of a source's changelog and mirror.

The tailer lives in :mod:`pipeline.tail` (a module per job; its package docstring tells how
it keeps a crash from losing or duplicating a change); this module keeps the names the rest
of the pipeline imports.
"""

from __future__ import annotations

from pipeline.handoff import chunk_path
from pipeline.tail.assemble import NOTICES, notice_path
from pipeline.tail.mirrors import MIRROR_DOC
from pipeline.tail.options import BatchReport, TailOptions, TailSummary
from pipeline.tail.tailer import Tailer, new_generation

__all__ = [
    "MIRROR_DOC",
    "NOTICES",
    "BatchReport",
    "TailOptions",
    "TailSummary",
    "Tailer",
    "chunk_path",
    "new_generation",
    "notice_path",
]
