"""The user functions of the Nexmark suite's SQL, in Python, for Weir's SQL jobs: q14's
``count_char`` (the suite's ``com.github.nexmark.flink.udf.CountChar``; its q14.sql declares it
``CREATE FUNCTION count_char AS '<that class>'``, which on Weir stands for the Python function given
to the job under the same name: ``weir sql --functions``, or ``functions=defined_in(this module)``)."""

from __future__ import annotations


def count_char(s: str | None, c: str) -> int:
    """How many bytes of ``s``'s UTF-8 are the first byte of ``c``'s; 0 for a NULL ``s``."""
    return 0 if s is None else s.encode().count(c.encode()[:1])


__all__ = ["count_char"]
