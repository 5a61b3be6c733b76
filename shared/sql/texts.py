"""ksqlDB's text functions that Java's classes define: SPLIT and SPLIT_TO_MAP (Guava's and
``String.split``'s delimiters taken as they are), CHR (``Character.toChars``), URL_ENCODE_PARAM
and URL_DECODE_PARAM (``URLEncoder``, ``URLDecoder``), in Python as Spark's SQL computes them.

Java indexes text by UTF-16 units and holds a lone half of a pair, which Spark's UTF-8 text
writes as ``?`` (``java_text``); these follow it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.java_text import java_string, utf16_units
from millpond.shared.sql.kinds import spark_once


def split(s: str, delimiter: str) -> list[str]:
    """ksqlDB's SPLIT: the parts of ``s`` between each ``delimiter`` (taken as it is, not as a
    pattern), empty ones kept; an empty delimiter splits ``s`` into its characters."""
    return (list(s) or [""]) if delimiter == "" else s.split(delimiter)


def split_in_spark(args: list[str]) -> str:
    """SPLIT in Spark SQL: Spark's ``split`` takes a Java pattern, so the delimiter is quoted
    (``\\Q...\\E``, each ``\\E`` in it closed and opened again, as ``Pattern.quote``); -1
    keeps the empty parts at the end."""
    text, delimiter = args
    quoted = f"concat('\\\\Q', replace({delimiter}, '\\\\E', '\\\\E\\\\\\\\E\\\\Q'), '\\\\E')"
    return f"(CASE WHEN {delimiter} = '' THEN split({text}, '', -1) ELSE split({text}, {quoted}, -1) END)"


def split_to_map(s: str, entry: str, pair: str) -> dict[str, str] | None:
    """ksqlDB's SPLIT_TO_MAP: the entries of ``s`` between each ``entry`` delimiter (empty ones
    left out), those with a ``pair`` delimiter each a key (before its first one) and a value (to
    the next one); a key given twice keeps its last value; NULL for an empty delimiter or the two
    the same."""
    if not entry or not pair or entry == pair:
        return None
    return {parts[0]: parts[1] for item in s.split(entry) if pair in item for parts in [item.split(pair)]}


def split_to_map_in_spark(args: list[str]) -> str:
    """SPLIT_TO_MAP in Spark SQL: the entries and the pair delimiter taken into one lambda's
    variable, so that no lambda reads an argument (a column of the variable's name would be the
    variable there)."""
    text, entry, pair = args

    def made(split_text: str) -> str:
        item, pair_of = "millpond_item", f"{split_text}.p"
        parts = split_in_spark([item, pair_of])
        kept = f"filter({split_text}.e, {item} -> {item} != '' AND instr({item}, {pair_of}) > 0)"
        return f"map_from_entries(transform({kept}, {item} -> named_struct('k', {parts}[0], 'v', {parts}[1])))"

    entries = f"named_struct('e', {split_in_spark([text, entry])}, 'p', {pair})"
    return f"(CASE WHEN {entry} != '' AND {pair} != '' AND {entry} != {pair} THEN {spark_once(entries, made)} END)"


def code_point(code: int) -> str | None:
    """ksqlDB's CHR: the character of a Unicode code point; NULL outside them, and (unlike
    ksqlDB's, which gives half of a UTF-16 pair no text can hold) for a surrogate."""
    return chr(code) if 0 <= code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else None


_UTF16_ESCAPES = r"(?:\\u(?:(?![dD][89a-fA-F])[0-9a-fA-F]{4}|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))+"
"""CHR's text form: ``\\uXXXX`` escapes, each a character of the BMP or two a pair of UTF-16 halves
(Java's regex and Python's alike)."""


def escaped_character(text: str) -> str | None:
    """ksqlDB's CHR of text: the characters its ``\\uXXXX`` escapes make; NULL for any other text
    (ksqlDB's unescapes Java's other escapes after the first too) and for a lone UTF-16 half."""
    if re.fullmatch(_UTF16_ESCAPES, text) is None:
        return None
    return bytes.fromhex(text.replace("\\u", "")).decode("utf-16-be")


def character(value: Any, type_: SqlType) -> str | None:
    """CHR: of a code point (``code_point``) or of its escapes as text (``escaped_character``)."""
    if value is None:
        return None
    return escaped_character(value) if type_.base == "VARCHAR" else code_point(value)


def chr_in_spark(args: list[str], types: list[SqlType]) -> str:
    """CHR in Spark SQL: text's escapes as hexadecimal UTF-16, decoded; a code point's UTF-16 units
    (a pair beyond the BMP) in hexadecimal, decoded; the argument computed once."""
    if types[0].base == "VARCHAR":
        pattern = "'^" + _UTF16_ESCAPES.replace("\\", "\\\\") + "$'"
        return spark_once(args[0], lambda text: f"CASE WHEN {text} RLIKE {pattern} THEN "
                                                f"decode(unhex(replace({text}, '\\\\u', '')), 'UTF-16BE') END")

    def made(code: str) -> str:
        beyond = f"({code} - 65536)"
        units = (f"CASE WHEN {code} < 65536 THEN lpad(hex({code}), 4, '0') "
                 f"ELSE concat(hex(55296 + shiftright({beyond}, 10)), hex(56320 + ({beyond} & 1023))) END")
        return (f"CASE WHEN {code} BETWEEN 0 AND 1114111 AND NOT {code} BETWEEN 55296 AND 57343 "
                f"THEN decode(unhex({units}), 'UTF-16BE') END")
    return spark_once(f"CAST({args[0]} AS INT)", made)


_URL_KEPT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.*")


def url_encode(s: str) -> str:
    """ksqlDB's URL_ENCODE_PARAM as Java's ``URLEncoder`` (Spark's ``url_encode``): letters,
    digits and ``-_.*`` kept, a space ``+``, the rest its UTF-8 bytes as ``%XX``."""
    return "".join(c if c in _URL_KEPT else "+" if c == " " else "".join(f"%{b:02X}" for b in c.encode())
                   for c in java_string(s))


def _java_hex_digit(c: str) -> int | None:
    """Java's ``Character.digit(c, 16)``: a decimal digit of any script, or A-F in ASCII or
    full width, in either case (a UTF-16 half: none)."""
    if c in "abcdefABCDEF" or "\uff21" <= c <= "\uff26" or "\uff41" <= c <= "\uff46":
        return (ord(c) - (0xFF21 if c >= "\uff21" else ord("A"))) % 32 + 10
    return unicodedata.decimal(c, None)


def _java_hex_byte(text: str) -> int | None:
    """Java's ``Integer.parseInt`` of two UTF-16 units in base 16 (a sign and one digit too), or
    None where it raises or gives a negative number (``URLDecoder``'s faults)."""
    sign, digits = (text[0], text[1:]) if text[0] in "+-" else ("+", text)
    values = [_java_hex_digit(c) for c in digits]
    if not values or None in values:
        return None
    value = sum(v * 16 ** i for i, v in enumerate(reversed(values)))
    return value if sign == "+" or value == 0 else None


def url_decode(s: str) -> str | None:
    """ksqlDB's URL_DECODE_PARAM as Java's ``URLDecoder`` (Spark's ``try_url_decode``), over the
    text's UTF-16 units: ``+`` a space, each run of ``%XX`` the text of its bytes in UTF-8 (a
    fault each a replacement character), the rest as it is; NULL for a ``%`` not followed by a
    byte (where ksqlDB's fails)."""
    units = utf16_units(java_string(s))
    out, at = [], 0
    while at < len(units):
        if units[at] == "+":
            out.append(" ")
            at += 1
        elif units[at] == "%":
            run = bytearray()
            while at + 2 < len(units) and units[at] == "%":
                byte = _java_hex_byte(units[at + 1:at + 3])
                if byte is None:
                    return None
                run.append(byte)
                at += 3
            if at < len(units) and units[at] == "%":
                return None
            out.append(run.decode("utf-8", "replace"))
        else:
            out.append(units[at])
            at += 1
    return java_string("".join(out))
