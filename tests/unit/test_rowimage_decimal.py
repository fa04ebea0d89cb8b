"""NEWDECIMAL decoding of the compiled row-image reader against an encoder written from
MySQL's storage format (groups of nine digits, sign bit, inverted when negative)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from dblog.sources.mysql.rowimage import _decimal_layout, _read_decimal

_GROUP_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def encode(sign: str, integral: str, fraction: str, precision: int, decimals: int) -> bytes:
    """MySQL's binary form of ``sign integral . fraction`` as DECIMAL(precision, decimals)."""
    width = precision - decimals
    integral = integral.zfill(width)[-width:] if width else ""
    head = (precision - decimals) % 9
    out = bytearray()
    if head:
        out += int(integral[:head]).to_bytes(_GROUP_BYTES[head], "big")
    for at in range(head, len(integral), 9):
        out += int(integral[at:at + 9]).to_bytes(4, "big")
    for at in range(0, decimals - decimals % 9, 9):
        out += int(fraction[at:at + 9]).to_bytes(4, "big")
    if decimals % 9:
        out += int(fraction[decimals - decimals % 9:]).to_bytes(_GROUP_BYTES[decimals % 9], "big")
    out[0] ^= 0x80
    if sign == "-":
        out = bytearray(b ^ 0xFF for b in out)
    return bytes(out)


@st.composite
def decimals(draw: st.DrawFn) -> tuple[str, int, int]:
    precision = draw(st.integers(1, 65))
    scale = draw(st.integers(0, min(precision, 30)))
    integral = draw(st.integers(0, 10 ** (precision - scale) - 1))
    fraction = draw(st.integers(0, 10**scale - 1))
    sign = draw(st.sampled_from(["", "-"]))
    text = f"{sign}{integral}" + (f".{fraction:0{scale}d}" if scale else "")
    return text, precision, scale


@given(decimals(), st.binary(max_size=3))
def test_every_precision_and_scale_decodes_to_its_value(
        case: tuple[str, int, int], before: bytes) -> None:
    text, precision, scale = case
    sign = "-" if text.startswith("-") else ""
    integral, _, fraction = text.lstrip("-").partition(".")
    stored = encode(sign, integral, fraction, precision, scale)
    value, end = _read_decimal(before + stored + b"\x01", len(before),
                               _decimal_layout(precision, scale))
    assert end == len(before) + len(stored)
    assert value == Decimal(text)
    assert value.as_tuple().exponent == -scale  # the column's scale, as the library's
    assert value.is_signed() == (sign == "-")
