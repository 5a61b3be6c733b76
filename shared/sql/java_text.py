"""Values written as text as Java writes them, for Spark's values in Python."""

from __future__ import annotations

import math
from decimal import Decimal


def utf16_halves(c: str) -> tuple[int, int]:
    """The two UTF-16 units (surrogates) of a character beyond the BMP, as a Java string holds it."""
    code = ord(c) - 0x10000
    return 0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)


def java_double_text(number: float) -> str:
    """A DOUBLE as text, as Spark's CAST writes it (Java's ``Double.toString``): plain from 10^-3
    up to 10^7 (``100.0``, ``0.001``), else ``1.0E20`` and ``1.5E-4``; ``NaN``, ``Infinity``.
    Python's shortest digits, which Java 17's also are but for rare values of 17 digits."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    if number == 0:
        return "-0.0" if math.copysign(1.0, number) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(number)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = len(text) + exponent  # digits before the decimal point, in plain notation
    if 1e-3 <= abs(number) < 1e7:
        whole, fraction = (text[:point], text[point:]) if point > 0 else ("0", "0" * -point + text)
        plain = f"{whole.ljust(point, '0') if point > 0 else whole}.{fraction or '0'}"
    else:
        plain = f"{text[0]}.{text[1:] or '0'}E{point - 1}"
    return ("-" if sign else "") + plain


def java_string(text: str) -> str:
    """Text as a Java string that Spark holds again as UTF-8 has it: a pair of UTF-16 halves the
    character they make, a lone half ``?`` (``String.getBytes``)."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return "".join("?" if "\ud800" <= c <= "\udfff" else c for c in joined)


def utf16_units(text: str) -> str:
    """Text as Java indexes it: each character beyond the BMP as its two UTF-16 halves."""
    return "".join(c if c <= "\uffff" else "".join(map(chr, utf16_halves(c))) for c in text)
