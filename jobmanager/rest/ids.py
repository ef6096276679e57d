"""Job ids in Flink's form. Flink's ``JobID`` is 32 hex characters, Weir's 16: a Weir id goes out in
Flink's fields (``jid``, ``id``) left-padded with zeros to 32 (``flink_job_id``), and a path takes
either form (``weir_job_id``), so ``weir list`` and ``flink list`` name the same job."""

from __future__ import annotations

import re
from typing import Final

JOB_ID_DIGITS: Final = 16
FLINK_ID_HEX: Final = 32
_HEX: Final = re.compile(r"[0-9a-f]+")
_PADDING: Final = "0" * (FLINK_ID_HEX - JOB_ID_DIGITS)


def flink_job_id(job_id: str) -> str:
    """A Weir job id as Flink's 32-hex JobID (zeros first); any other id unchanged."""
    if len(job_id) == JOB_ID_DIGITS and _HEX.fullmatch(job_id):
        return _PADDING + job_id
    return job_id


def weir_job_id(job_id: str) -> str:
    """The Weir job id a path names: Flink's 32-hex form of one (``flink_job_id``), or the Weir id."""
    lowered = job_id.lower()
    if len(lowered) == FLINK_ID_HEX and _HEX.fullmatch(lowered) and lowered.startswith(_PADDING):
        return lowered[len(_PADDING) :]
    return job_id
