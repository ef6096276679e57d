"""Key samples: a bounded sample of the records a keyed operator keyed, each with the key it got,
kept in the operator's keyed state so that ``weir upgrade check`` can run a new version's key
function over them (stored keys alone cannot tell what a new key function makes of the records they
came from).

Each keyed operator subtask samples the first :data:`SAMPLES_AT_OPEN` records it keys after it
opens and the first :data:`SAMPLES_PER_INTERVAL` after each checkpoint: one attribute tested per
record, nothing else on the hot path; a sample costs about 5 µs (a pickle of the record and a put),
so a checkpoint interval pays some 40 µs, and the slots fill up over the intervals.
A sampled record is stored in the state :data:`KEY_SAMPLE_STATE` of its key's key group, in one of
:data:`SLOTS_PER_KEY_GROUP` slots picked by its key's bytes (a later sample of a key in the same slot
replaces the earlier one), so an operator never keeps more than ``max_parallelism *
SLOTS_PER_KEY_GROUP`` samples, whatever its parallelism, and the samples move with their key groups
when a job is rescaled. Which records are sampled depends only on the order of the input, so a replay
samples the same records.

A sample is a tuple of built-in values (no class is pickled but the record's own)::

    ("weir.key-sample/1", input index, key function fingerprint, key bytes, key repr, record pickle)

documented in docs/formats.md ("Key samples"). The fingerprint (:func:`key_function_fingerprint`)
is a hash of the key function's code: a second signal that it changed, when no sample shows it.
"""

from __future__ import annotations

import hashlib
import re
import types
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from weir.core.errors import SerializationError

KEY_SAMPLE_STATE: Final = "weir.key-samples"
"""The keyed state a keyed operator keeps its key samples in (a runtime state, never declared)."""
KEY_SAMPLE_FORMAT: Final = "weir.key-sample/1"
SAMPLES_AT_OPEN: Final = 64
"""How many records a subtask samples when it opens (the first ones it keys)."""
SAMPLES_PER_INTERVAL: Final = 8
"""How many records a subtask samples after each checkpoint (the first ones it keys)."""
SLOTS_PER_KEY_GROUP: Final = 8
"""At most this many samples per key group and operator."""
KEY_REPR_CHARS: Final = 200
_ADDRESS: Final = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_repr(value: object) -> bytes:
    """A repr without memory addresses (they differ between processes)."""
    return _ADDRESS.sub("", repr(value)).encode()


def sample_slot(key_bytes: bytes) -> bytes:
    """The state key of the slot a key's sample goes to in its key group (one byte): Adler-32 of the
    key's bytes, as the key group is their CRC-32 (the slot must not follow from the key group)."""
    return bytes((zlib.adler32(key_bytes) % SLOTS_PER_KEY_GROUP,))


@dataclass(frozen=True)
class KeySample:
    """One sampled record of input ``input_index``: its value as pickled (``record``), and the key
    the key function with fingerprint ``fingerprint`` gave it (its bytes, ``key_to_bytes``, and repr)."""

    input_index: int
    fingerprint: str
    key_bytes: bytes
    key_repr: str
    record: bytes

    def to_stored(self) -> tuple[str, int, str, bytes, str, bytes]:
        return (KEY_SAMPLE_FORMAT, self.input_index, self.fingerprint, self.key_bytes, self.key_repr, self.record)

    @classmethod
    def from_stored(cls, value: object) -> KeySample:
        """A stored sample; raises SerializationError for another format."""
        match value:
            case (str() as fmt, int() as index, str() as fp, bytes() as kb, str() as kr, bytes() as record) if (
                fmt == KEY_SAMPLE_FORMAT
            ):
                return cls(index, fp, kb, kr, record)
            case (str() as fmt, *_):
                raise SerializationError(f"key sample of format {fmt!r}, this Weir reads {KEY_SAMPLE_FORMAT!r}")
            case _:
                raise SerializationError(f"not a key sample: {type(value).__name__}")


def _code_digest(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(_stable_repr(const))


def key_function_fingerprint(fn: Callable[[Any], Any]) -> str:
    """A hash of what a key function computes, from its code (bytecode, names, constants, of the
    functions it defines too) and the values it closes over or is bound to; neither its name, file
    nor line numbers, so moving it does not change it. A function without code (a builtin, an
    ``operator.itemgetter``) is fingerprinted by its repr. Functions it calls are not followed: a
    change inside a helper it calls is seen only by the samples."""
    h = hashlib.sha256()
    target: Any = fn
    while True:
        match target:
            case types.MethodType():
                h.update(repr(type(target.__self__)).encode())
                target = target.__func__
            case _ if hasattr(target, "func") and hasattr(target, "args"):  # functools.partial
                h.update(_stable_repr((target.args, sorted(getattr(target, "keywords", {}).items()))))
                target = target.func
            case _:
                break
    code = getattr(target, "__code__", None)
    if isinstance(code, types.CodeType):
        _code_digest(code, h)
        for cell in getattr(target, "__closure__", None) or ():
            try:
                h.update(_stable_repr(cell.cell_contents))
            except ValueError:  # an empty cell
                h.update(b"<empty>")
    else:
        h.update(_stable_repr(target))
    return h.hexdigest()[:16]
