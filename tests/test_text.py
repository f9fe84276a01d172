"""The text front end on hostile input: nothing but plain, speakable text gets through."""

from __future__ import annotations

import pytest

from agent.formats.text import clean_text


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("The door is open.", "The door is open."),
        ("<speak>Hello <break time='1s'/> world</speak>", "Hello world"),
        ('<p class="x">Fire</p> <!-- comment --> alarm', "Fire alarm"),
        ("if a < b and c > d", "if a < b and c > d"),
        ("Tom &amp; Jerry", "Tom & Jerry"),
        ("&lt;b&gt;bold&lt;/b&gt;", "<b>bold</b>"),
        ("say [[ hɛloʊ ]] now", "say hɛloʊ now"),
        ("[[[nested]]] and ]][[", "[nested ] and"),
        ("bell\x07 null\x00 esc\x1b[31m red", "bell null esc[31m red"),
        ("zero\u200bwidth\ufeff and soft\u00adhyphen", "zerowidth and softhyphen"),
        ("right\u202eto left", "rightto left"),
        ("ﬁre ＦＩＲＥ ①", "fire FIRE 1"),
        ("line one\nline two\r\n\tthree", "line one line two three"),
        ("   ", ""),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


def test_ten_thousand_newlines_collapse() -> None:
    assert clean_text("a" + "\n" * 10_000 + "b") == "a b"


def test_a_megabyte_of_hostile_text_is_cleaned() -> None:
    unit = "<b>x</b>[[ɑ]]\x00\u200b &amp; <" + "y" * 20 + "\n"
    text = unit * (1_000_000 // len(unit))
    cleaned = clean_text(text)
    assert "<b>" not in cleaned
    assert "[[" not in cleaned
    assert "]]" not in cleaned
    assert "\x00" not in cleaned
    assert "\u200b" not in cleaned
    assert "\n" not in cleaned
    assert cleaned.count("x ɑ & <") == text.count("<b>x</b>")


def test_tags_cannot_be_rebuilt_from_pieces_of_raw_phoneme_escapes() -> None:
    assert "[[" not in clean_text("[<i>[ ɑ ]</i>]")
    assert "[[" not in clean_text("[" * 1001)
