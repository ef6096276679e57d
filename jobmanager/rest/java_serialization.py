"""One Java object in Java's serialization format (the Java Object Serialization Specification, chapter
6, "Object Serialization Stream Protocol"): an ``org.apache.flink.util.SerializedThrowable``, which
Flink's REST API carries base64-encoded as a failure's ``serialized-throwable`` (its
``SerializedThrowableSerializer``) and which Flink's Java client needs to read a failure back (its
``SerializedThrowableDeserializer`` deserializes those bytes; without them it reports the answer as
malformed). Pure: bytes out, nothing read.

What is written, and why the reader accepts it: a ``SerializedThrowable`` whose fields are the failure's
class name (``originalErrorClassName``), its Python traceback (``fullStringifiedStackTrace``, what
``printStackTrace`` prints) and no serialized original (``serializedException`` null, so
``deserializeError`` answers the ``SerializedThrowable`` itself, and ``toString`` is ``class: message``);
its ``Throwable`` part has the message (``detailMessage``), no cause and, as a Throwable serialized by an
old JDK, no stack trace and no suppressed exceptions (``Throwable.readObject`` takes both nulls). No
back-references are written (each string is written anew), so no handle needs tracking.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

STREAM_MAGIC: Final = 0xACED
STREAM_VERSION: Final = 5
TC_NULL: Final = 0x70
TC_CLASSDESC: Final = 0x72
TC_OBJECT: Final = 0x73
TC_STRING: Final = 0x74
TC_ENDBLOCKDATA: Final = 0x78
TC_LONGSTRING: Final = 0x7C
SC_WRITE_METHOD: Final = 0x01
SC_SERIALIZABLE: Final = 0x02
_SHORT_STRING_MAX: Final = 0xFFFF


@dataclass(frozen=True)
class JavaField:
    """An object field of a class descriptor: ``L`` (an object) or ``[`` (an array), its JVM signature."""

    typecode: str
    name: str
    signature: str


@dataclass(frozen=True)
class JavaClass:
    """A serializable class as its descriptor names it: fields in the order Java writes them (by name;
    every field here is an object), then its superclass's descriptor."""

    name: str
    serial_version_uid: int
    flags: int
    fields: tuple[JavaField, ...]
    superclass: JavaClass | None


THROWABLE: Final = JavaClass(
    "java.lang.Throwable",
    -3042686055658047285,
    SC_SERIALIZABLE | SC_WRITE_METHOD,  # Throwable.writeObject: its fields, then the end of its block
    (
        JavaField("L", "cause", "Ljava/lang/Throwable;"),
        JavaField("L", "detailMessage", "Ljava/lang/String;"),
        JavaField("[", "stackTrace", "[Ljava/lang/StackTraceElement;"),
        JavaField("L", "suppressedExceptions", "Ljava/util/List;"),
    ),
    None,
)
EXCEPTION: Final = JavaClass("java.lang.Exception", -3387516993124229948, SC_SERIALIZABLE, (), THROWABLE)
SERIALIZED_THROWABLE: Final = JavaClass(
    "org.apache.flink.util.SerializedThrowable",
    7284183123441947635,
    SC_SERIALIZABLE,
    (
        JavaField("L", "fullStringifiedStackTrace", "Ljava/lang/String;"),
        JavaField("L", "originalErrorClassName", "Ljava/lang/String;"),
        JavaField("[", "serializedException", "[B"),
    ),
    EXCEPTION,
)


def modified_utf8(text: str) -> bytes:
    """Java's modified UTF-8 (``DataOutput.writeUTF``'s encoding): each UTF-16 code unit on its own,
    U+0000 as two bytes, a character beyond the BMP as its two surrogates of three bytes each."""
    utf16 = text.encode("utf-16-be", "surrogatepass")
    units = struct.unpack(f">{len(utf16) // 2}H", utf16)
    out = bytearray()
    for unit in units:
        if 0x0001 <= unit <= 0x007F:
            out.append(unit)
        elif unit <= 0x07FF:
            out += bytes((0xC0 | (unit >> 6), 0x80 | (unit & 0x3F)))
        else:
            out += bytes((0xE0 | (unit >> 12), 0x80 | ((unit >> 6) & 0x3F), 0x80 | (unit & 0x3F)))
    return bytes(out)


def _utf(text: str) -> bytes:
    """A class or field name: ``writeUTF``, its length first (u2)."""
    encoded = modified_utf8(text)
    if len(encoded) > _SHORT_STRING_MAX:
        raise ValueError(f"a Java name is at most {_SHORT_STRING_MAX} bytes, got {len(encoded)}")
    return struct.pack(">H", len(encoded)) + encoded


def string_object(text: str | None) -> bytes:
    """A String object: TC_STRING (u2 length) or, past 65535 bytes, TC_LONGSTRING (u8 length); None: TC_NULL."""
    if text is None:
        return bytes((TC_NULL,))
    encoded = modified_utf8(text)
    if len(encoded) <= _SHORT_STRING_MAX:
        return bytes((TC_STRING,)) + struct.pack(">H", len(encoded)) + encoded
    return bytes((TC_LONGSTRING,)) + struct.pack(">Q", len(encoded)) + encoded


def class_descriptor(java_class: JavaClass | None) -> bytes:
    if java_class is None:
        return bytes((TC_NULL,))
    out = bytearray((TC_CLASSDESC,))
    out += _utf(java_class.name)
    out += struct.pack(">q", java_class.serial_version_uid)
    out.append(java_class.flags)
    out += struct.pack(">H", len(java_class.fields))
    for field in java_class.fields:
        out += field.typecode.encode("ascii") + _utf(field.name) + string_object(field.signature)
    out.append(TC_ENDBLOCKDATA)  # no class annotation
    out += class_descriptor(java_class.superclass)
    return bytes(out)


def serialized_throwable(class_name: str, message: str | None, stack_trace: str) -> bytes:
    """The Java serialization of a Flink ``SerializedThrowable`` standing for a failure of class
    ``class_name`` (shown as Flink shows an exception's class) with ``message``, printing ``stack_trace``."""
    out = bytearray(struct.pack(">HH", STREAM_MAGIC, STREAM_VERSION))
    out.append(TC_OBJECT)
    out += class_descriptor(SERIALIZED_THROWABLE)
    # The class data, the topmost superclass first. Throwable: cause, detailMessage, stackTrace,
    # suppressedExceptions, then the end of the block its writeObject method opened.
    out += bytes((TC_NULL,)) + string_object(message) + bytes((TC_NULL, TC_NULL, TC_ENDBLOCKDATA))
    # Exception: no fields. SerializedThrowable: fullStringifiedStackTrace, originalErrorClassName,
    # serializedException.
    out += string_object(stack_trace) + string_object(class_name) + bytes((TC_NULL,))
    return bytes(out)
