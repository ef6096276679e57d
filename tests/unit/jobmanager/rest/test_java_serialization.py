"""Java's serialization of Flink's ``SerializedThrowable`` (``weir.jobmanager.rest.java_serialization``):
modified UTF-8 as ``DataOutput.writeUTF`` writes it, short and long strings, and the whole stream of a
small failure byte for byte (the stream Java's ``ObjectInputStream`` read back as Flink's class, with
its message, class name and printed trace: tests/integration/jobmanager/test_flink_rest_client.py
decodes such streams with Flink's own client)."""

from __future__ import annotations

import struct

import pytest

from weir.jobmanager.rest.java_serialization import (
    TC_LONGSTRING,
    TC_NULL,
    TC_STRING,
    modified_utf8,
    serialized_throwable,
    string_object,
)


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("", b""),
        ("abc", b"abc"),
        ("\x00", b"\xc0\x80"),  # NUL takes two bytes: no zero byte in modified UTF-8
        ("é", b"\xc3\xa9"),
        ("€", b"\xe2\x82\xac"),
        ("😀", b"\xed\xa0\xbd\xed\xb8\x80"),  # beyond the BMP: each surrogate in three bytes
    ],
)
def test_modified_utf8_is_java_s(text: str, encoded: bytes) -> None:
    assert modified_utf8(text) == encoded


def test_a_string_is_short_up_to_65535_bytes_then_long_and_none_is_null() -> None:
    short = "x" * 0xFFFF
    assert string_object(short) == bytes((TC_STRING,)) + struct.pack(">H", 0xFFFF) + short.encode()
    long = "é" * 0x8000  # 65536 bytes
    assert string_object(long) == bytes((TC_LONGSTRING,)) + struct.pack(">Q", 0x10000) + long.encode()
    assert string_object(None) == bytes((TC_NULL,))


def test_a_small_failure_s_stream_byte_for_byte() -> None:
    assert serialized_throwable("E", "m", "t").hex() == GOLDEN


# What Java 17's ObjectInputStream reads as a SerializedThrowable whose toString is "E: m", original class
# name "E", printed trace "t", no cause, no stack trace, no suppressed exceptions and no serialized
# original (deserializeError answers itself): checked with flink-core 2.2.1 when this was written.
GOLDEN = (
    "aced0005737200296f72672e6170616368652e666c696e6b2e7574696c2e53657269616c697a65645468726f7761626c"
    "6565169df51fa713f30200034c001966756c6c537472696e676966696564537461636b54726163657400124c6a617661"
    "2f6c616e672f537472696e673b4c00166f726967696e616c4572726f72436c6173734e616d657400124c6a6176612f6c"
    "616e672f537472696e673b5b001373657269616c697a6564457863657074696f6e7400025b42787200136a6176612e6c"
    "616e672e457863657074696f6ed0fd1f3e1a3b1cc4020000787200136a6176612e6c616e672e5468726f7761626c65d5"
    "c635273977b8cb0300044c000563617573657400154c6a6176612f6c616e672f5468726f7761626c653b4c000d646574"
    "61696c4d6573736167657400124c6a6176612f6c616e672f537472696e673b5b000a737461636b547261636574001e5b"
    "4c6a6176612f6c616e672f537461636b5472616365456c656d656e743b4c001473757070726573736564457863657074"
    "696f6e737400104c6a6176612f7574696c2f4c6973743b7870707400016d707078740001747400014570"
)
