"""Environment text shown to a person: control characters escaped, bounded length."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from preflight.core.textsafe import escape


def test_escapes_what_drives_a_terminal_or_forges_a_line() -> None:
    assert escape("0\x1b[2J\nPASS\r\x07\x9b") == "0\\e[2J\\nPASS\\r\\x07\\x9b"
    assert escape("a\u2028b") == "a\\u2028b"
    assert escape("plain: é ü 漢字") == "plain: é ü 漢字"
    assert escape("x" * 50, 10) == "xxxxxxx..."


@given(st.text(), st.integers(min_value=3, max_value=200))
def test_output_has_no_control_character_and_respects_the_limit(text: str, limit: int) -> None:
    out = escape(text, limit)
    assert len(out) <= limit
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in out)
