"""SSML to segments: each element's effect, nesting, white space, hostile documents, fuzzing."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.segments import Pause, Segment, Sound, Speech
from agent.formats import ssml
from agent.formats.markup import is_ssml
from agent.formats.ssml import (
    BREAK_STRENGTHS,
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_PAUSE,
    MAX_RATE,
    MAX_SSML_CHARS,
    MIN_RATE,
    PARAGRAPH_PAUSE,
    SENTENCE_PAUSE,
    SsmlError,
    in_language,
    parse_ssml,
    spoken_text,
)
from agent.formats.text import clean_text

FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PEAK_BYTES = 2 * 1024 * 1024
"""Memory a rejected hostile document may cost while parsing (tracemalloc peak)."""


def speak(body: str, lang: str = "en") -> tuple[Segment, ...]:
    return parse_ssml(f"<speak>{body}</speak>", lang=lang)


def beside(text: str, *, before: bool = False, after: bool = False) -> Speech:
    """Speech with a break just before it and/or just after it (its edges are trimmed)."""
    return Speech(text, break_before=before, break_after=after)


def texts(segments: tuple[Segment, ...]) -> list[str]:
    return [s.text for s in segments if isinstance(s, Speech)]


def rejected(document: str) -> SsmlError:
    with pytest.raises(SsmlError) as caught:
        parse_ssml(document)
    assert caught.value.reason == "invalid_ssml"
    return caught.value


# ---- plain text and white space -----------------------------------------------------------


def test_plain_text_inside_speak_is_one_cleaned_speech() -> None:
    segments = speak("\n  Hello,\t\n   world!  \x85 ")
    assert segments == (Speech("Hello, world!"),)


def test_text_goes_through_the_same_clean_up_as_plain_text() -> None:
    segments = speak("Say [[ h@l ]] &amp; &lt;b&gt;bold&lt;/b&gt;\u200b now")
    assert texts(segments) == [clean_text("Say [[ h@l ]] & <b>bold</b>\u200b now")]
    assert "[[" not in texts(segments)[0]
    assert "<" not in texts(segments)[0]


def test_an_empty_document_says_nothing() -> None:
    assert parse_ssml("<speak/>") == ()
    assert speak("  \n ") == ()


def test_inline_elements_do_not_split_words() -> None:
    assert speak("un<emphasis>believ</emphasis>able") == (Speech("unbelievable"),)


def test_leading_white_space_and_a_byte_order_mark_are_allowed() -> None:
    assert parse_ssml("\ufeff\n  <speak>Hi</speak>") == (Speech("Hi"),)
    assert parse_ssml('<?xml version="1.0"?>\n<speak>Hi</speak>') == (Speech("Hi"),)


def test_a_namespaced_document_reads_the_same() -> None:
    document = (
        '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">'
        'A<break time="1s"/>B</speak>'
    )
    assert parse_ssml(document) == (beside("A", after=True), Pause(1.0), beside("B", before=True))


# ---- break, s, p ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "seconds"),
    [
        ('time="500ms"', 0.5),
        ('time="2s"', 2.0),
        ('time="1.5s"', 1.5),
        ('time="250 ms"', 0.25),
        ('time="30s"', MAX_PAUSE),  # capped
        ('time="2s" strength="weak"', 2.0),  # time wins
        ("", BREAK_STRENGTHS["medium"]),
        *((f'strength="{name}"', value) for name, value in BREAK_STRENGTHS.items() if value),
    ],
)
def test_a_break_is_a_pause_between_speech(attributes: str, seconds: float) -> None:
    segments = speak(f"One<break {attributes}/>two")
    assert segments == (beside("One", after=True), Pause(seconds), beside("two", before=True))


def test_a_break_of_strength_none_or_zero_time_makes_no_pause_but_joins_the_speech() -> None:
    joined = (beside("One", after=True), beside("two", before=True))
    assert speak('One<break strength="none"/>two') == joined
    assert speak('One<break time="0ms"/>two') == joined
    assert speak('One<prosody rate="fast">two</prosody>') == (  # a change of style: no break
        Speech("One"),
        Speech("two", rate=1.25),
    )


def test_strengths_grow() -> None:
    values = list(BREAK_STRENGTHS.values())
    assert values == sorted(values)
    assert values[0] == 0


def test_breaks_in_a_row_add_up_to_the_cap() -> None:
    segments = speak('A<break time="1s"/> <break time="2s"/>B')
    assert segments == (beside("A", after=True), Pause(3), beside("B", before=True))
    assert speak('A<break time="8s"/><break time="8s"/>B')[1] == Pause(MAX_PAUSE)


def test_explicit_breaks_are_kept_at_the_ends() -> None:
    segments = speak('<break time="1s"/>Hi<break time="2s"/>')
    assert segments == (Pause(1.0), beside("Hi", before=True, after=True), Pause(2.0))


@pytest.mark.parametrize("time", ["x", "5", "-1s", "1h", "1e3ms", "١s", "inf s", ""])  # noqa: RUF001
def test_a_bad_break_time_is_an_error_with_its_position(time: str) -> None:
    err = rejected(f'<speak>\n  Hi <break time="{time}"/></speak>')
    assert (err.line, err.column) == (2, 6)
    assert "break time" in err.detail


def test_a_bad_break_strength_is_an_error() -> None:
    assert "strength" in rejected('<speak><break strength="huge"/></speak>').detail


def test_sentences_and_paragraphs_are_separated_by_pauses() -> None:
    segments = speak("<p><s>One</s><s>Two</s></p><p><s>Three</s>Four</p>")
    assert segments == (
        beside("One", after=True),
        Pause(SENTENCE_PAUSE),
        beside("Two", before=True, after=True),
        Pause(PARAGRAPH_PAUSE),  # the longer boundary wins, not the sum
        beside("Three", before=True, after=True),
        Pause(SENTENCE_PAUSE),
        beside("Four", before=True),  # the end of a paragraph at the end: no break
    )
    assert SENTENCE_PAUSE < PARAGRAPH_PAUSE


def test_boundaries_at_the_ends_make_no_silence() -> None:
    assert speak("<p><s>Only</s></p>") == (
        Speech(
            "Only",
        ),
    )


def test_a_break_longer_than_a_boundary_replaces_it() -> None:
    segments = speak('<s>One</s><break time="2s"/><s>Two</s>')
    assert segments == (beside("One", after=True), Pause(2.0), beside("Two", before=True))


# ---- prosody ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "factor"),
    [
        ("x-slow", 0.5),
        ("slow", 0.75),
        ("medium", 1.0),
        ("fast", 1.25),
        ("x-fast", 1.5),
        ("80%", 0.8),
        ("150%", 1.5),
        ("+20%", 1.2),
        ("-20%", 0.8),
        ("0.8", 0.8),
        ("1.5", 1.5),
        ("10", MAX_RATE),  # clamped
        ("1%", MIN_RATE),
    ],
)
def test_prosody_rate_is_a_speaking_rate_factor(rate: str, factor: float) -> None:
    segments = speak(f'Normal <prosody rate="{rate}">changed</prosody> normal')
    if factor == 1.0:  # nothing changes: one piece of speech
        assert segments == (Speech("Normal changed normal"),)
    else:
        assert segments == (Speech("Normal"), Speech("changed", rate=factor), Speech("normal"))


@pytest.mark.parametrize(
    ("volume", "gain"),
    [
        ("silent", 0.0),
        ("x-soft", 0.2512),
        ("soft", 0.5012),
        ("medium", 1.0),
        ("loud", 1.0),  # capped at 1
        ("x-loud", 1.0),
        ("-6dB", 0.5012),
        ("-20dB", 0.1),
        ("+3dB", 1.0),
        ("50%", 0.5),
        ("200%", 1.0),
        ("-25%", 0.75),
    ],
)
def test_prosody_volume_is_a_linear_gain_capped_at_one(volume: str, gain: float) -> None:
    segments = speak(f'<prosody volume="{volume}">words</prosody>')
    assert segments == (Speech("words", volume=gain),)


def test_nested_prosody_multiplies() -> None:
    segments = speak(
        '<prosody rate="50%" volume="50%">a<prosody rate="150%" volume="50%">b'
        '<prosody volume="+6.0206dB" rate="x-fast">c</prosody></prosody>d</prosody>'
    )
    assert segments == (
        Speech("a", rate=0.5, volume=0.5),
        Speech("b", rate=0.75, volume=0.25),
        Speech("c", rate=1.125, volume=0.5),
        Speech("d", rate=0.5, volume=0.5),
    )


def test_loud_undoes_an_enclosing_soft() -> None:
    segments = speak('<prosody volume="soft"><prosody volume="loud">back</prosody></prosody>')
    assert segments == (Speech("back", volume=1.0),)


def test_deeply_nested_prosody_stays_finite() -> None:
    depth = MAX_DEPTH - 1
    document = '<prosody volume="+100dB" rate="999999%">' * depth + "x" + "</prosody>" * depth
    assert speak(document) == (Speech("x", rate=MAX_RATE, volume=1.0),)


def test_other_prosody_attributes_change_nothing() -> None:
    assert speak('<prosody pitch="+10%" contour="(0%,+20Hz)">hi</prosody>') == (Speech("hi"),)


@pytest.mark.parametrize(
    "attribute",
    ['rate="0%"', 'rate="quick"', 'rate="-1"', 'rate="nan"', 'volume="-150%"', 'volume="0.5"'],
)
def test_a_bad_prosody_value_is_an_error(attribute: str) -> None:
    err = rejected(f"<speak>ok <prosody {attribute}>no</prosody></speak>")
    assert "prosody" in err.detail
    assert err.column == 11


# ---- say-as, sub --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("interpret_as", "format_", "content", "said"),
    [
        ("characters", "", "ABC", "A B C"),
        ("spell-out", "", "a b1", "a b 1"),
        ("digits", "", "123", "one two three"),
        ("cardinal", "", "1234", "one thousand two hundred and thirty-four"),
        ("cardinal", "", "1,234", "one thousand two hundred and thirty-four"),
        ("cardinal", "", "-3.5", "minus three point five"),
        ("cardinal", "", "12345678901234567890", "one two three four five six seven eight nine "
         "zero one two three four five six seven eight nine zero"),
        ("ordinal", "", "3", "third"),
        ("ordinal", "", "21st", "twenty-first"),
        ("date", "ymd", "2024-03-05", "March fifth, twenty twenty-four"),
        ("date", "dmy", "05/03/2024", "March fifth, twenty twenty-four"),
        ("date", "mdy", "3.5.2024", "March fifth, twenty twenty-four"),
        ("date", "", "2024-03-05", "March fifth, twenty twenty-four"),
        ("date", "md", "12/25", "December twenty-fifth"),
        ("date", "y", "1999", "nineteen ninety-nine"),
        ("time", "", "14:05", "fourteen oh five"),
        ("time", "", "14:30:15", "fourteen thirty and fifteen seconds"),
        ("time", "", "14:00", "fourteen hundred"),
        ("time", "hms12", "2:00 pm", "two o'clock P M"),
        ("time", "", "9:45 a.m.", "nine forty-five A M"),
        ("telephone", "", "+1 (555) 123-4567",
         "plus one, five five five, one two three, four five six seven"),
    ],
)  # fmt: skip
def test_say_as_turns_content_into_words(
    interpret_as: str, format_: str, content: str, said: str
) -> None:
    document = f'Now <say-as interpret-as="{interpret_as}" format="{format_}">{content}</say-as>.'
    assert speak(document) == (Speech(f"Now {said}."),)


@pytest.mark.parametrize(
    ("interpret_as", "format_", "content"),
    [
        ("cardinal", "", "twelve"),
        ("ordinal", "", "-3"),
        ("date", "dmy", "31/02/2024"),  # no such day
        ("date", "dmy", "2024-03"),  # fields do not match the format
        ("date", "", "05/03/2024"),  # which order? not said
        ("date", "ymq", "2024-03-05"),
        ("time", "", "25:00"),
        ("time", "", "13:00 pm"),
        ("unknown-type", "", "as is"),
    ],
)
def test_say_as_content_that_does_not_fit_is_read_as_it_is(
    interpret_as: str, format_: str, content: str
) -> None:
    document = f'<say-as interpret-as="{interpret_as}" format="{format_}">{content}</say-as>'
    assert speak(document) == (Speech(content),)


def test_say_as_numbers_follow_the_voice_language() -> None:
    document = (
        '<say-as interpret-as="cardinal">21</say-as> <say-as interpret-as="ordinal">3</say-as>'
    )
    assert texts(speak(document, lang="de_DE")) == ["einundzwanzig dritte"]
    assert texts(speak(document, lang="xx")) == ["21 3"]  # no words known: espeak reads digits


def test_a_document_parsed_once_is_said_in_any_voice_language_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parsed on arrival (in English), said later in the language of the voice chosen for it:
    the same as parsing it in that language, with no second parse (the parser is broken after
    the first)."""
    document = (
        '<speak>Gate <say-as interpret-as="cardinal">21</say-as>, <break time="1s"/>'
        '<audio src="bell"><say-as interpret-as="ordinal">3</say-as> bell</audio> now.</speak>'
    )
    arrived, plain = parse_ssml(document), speak("No numbers here.")
    expected = {lang: parse_ssml(document, lang=lang) for lang in ("de_DE", "fr", "xx")}

    def no_parse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(ssml, "_Builder", no_parse)
    assert texts(arrived) == ["Gate twenty-one,", "now."]
    for lang, parsed in expected.items():
        said = in_language(arrived, lang)
        assert said == parsed
        assert [s.text for s in said if isinstance(s, Speech)] == texts(parsed)
        sound = next(s for s in said if isinstance(s, Sound))
        assert sound.fallback == next(s for s in parsed if isinstance(s, Sound)).fallback
    assert texts(in_language(arrived, "de_DE")) == ["Gate einundzwanzig,", "now."]
    assert texts(in_language(arrived, "xx")) == ["Gate 21,", "now."]  # espeak reads digits
    assert in_language(plain, "de_DE") == plain  # nothing in it depends on the language


def test_say_as_reads_the_text_of_nested_elements_as_one() -> None:
    document = '<say-as interpret-as="characters">A<emphasis>B</emphasis><break/>C</say-as>'
    assert speak(document) == (Speech("A B C"),)


def test_sub_speaks_its_alias_instead_of_its_content() -> None:
    segments = speak('I use the <sub alias="World Wide Web">WWW</sub>.')
    assert segments == (Speech("I use the World Wide Web."),)


def test_sub_needs_an_alias() -> None:
    assert "alias" in rejected("<speak><sub>WWW</sub></speak>").detail


# ---- voice --------------------------------------------------------------------------------


def test_voice_switches_voice_and_speaker_and_nests() -> None:
    segments = speak(
        'Default <voice name="amy">Amy <voice speaker="2">Amy two '
        '<voice name="joe#5">Joe five</voice> <voice name="#3">Amy three</voice></voice>'
        '</voice><voice name="multi" speaker="alice">Alice</voice> default'
    )
    assert segments == (
        Speech("Default"),
        Speech("Amy", voice="amy"),
        Speech("Amy two", voice="amy", speaker="2"),
        Speech("Joe five", voice="joe", speaker="5"),
        Speech("Amy three", voice="amy", speaker="3"),
        Speech("Alice", voice="multi", speaker="alice"),
        Speech("default"),
    )


def test_a_new_voice_starts_with_its_default_speaker() -> None:
    segments = speak('<voice name="a#1"><voice name="b">B</voice></voice>')
    assert segments == (Speech("B", voice="b"),)


def test_voice_attributes_other_than_name_and_speaker_change_nothing() -> None:
    assert speak('<voice gender="female" age="30">Hi</voice>') == (Speech("Hi"),)


@pytest.mark.parametrize("name", ["a\x85b", "x" * 65, "#"])
def test_a_bad_voice_name_is_an_error(name: str) -> None:
    assert "voice" in rejected(f'<speak><voice name="{name}">Hi</voice></speak>').detail


def test_prosody_and_voice_combine() -> None:
    segments = speak('<voice name="amy"><prosody rate="fast">Quick</prosody></voice>')
    assert segments == (Speech("Quick", rate=1.25, voice="amy"),)


# ---- audio --------------------------------------------------------------------------------


def test_audio_is_a_named_sound_with_its_content_as_fallback() -> None:
    segments = speak('Listen <audio src="doorbell">a bell <break time="1s"/> rings</audio> done')
    assert segments == (
        Speech("Listen"),
        Sound(
            "doorbell",
            (beside("a bell", after=True), Pause(1.0), beside("rings", before=True)),
            names_only=True,
        ),
        Speech("done"),
    )
    assert spoken_text(segments) == "Listen a bell rings done"


def test_audio_without_content_has_no_fallback_and_takes_the_volume() -> None:
    segments = speak('<prosody volume="50%"><audio src="chime.wav"/></prosody>')
    assert segments == (Sound("chime.wav", (), 0.5, names_only=True),)


def test_a_pause_before_a_sound_is_kept() -> None:
    segments = speak('Hi<break time="1s"/><audio src="x"/>')
    assert segments == (beside("Hi", after=True), Pause(1.0), Sound("x", names_only=True))


def test_speech_after_a_sound_is_not_marked_by_a_break_before_the_sound() -> None:
    segments = speak('<break time="1s"/><audio src="x"/>Hi')
    assert segments == (Pause(1.0), Sound("x", names_only=True), Speech("Hi"))


def test_audio_needs_a_source() -> None:
    assert "src" in rejected("<speak><audio>fallback</audio></speak>").detail


# ---- other elements -----------------------------------------------------------------------


def test_unknown_elements_are_read_for_their_text() -> None:
    segments = speak(
        '<emphasis level="strong">Big</emphasis> <lang xml:lang="fr">oui</lang> '
        '<phoneme alphabet="ipa" ph="təˈmeɪtoʊ">tomato</phoneme> <mark name="m"/>'  # noqa: RUF001
        "<custom>yes</custom>"
    )
    assert segments == (Speech("Big oui tomato yes"),)


def test_descriptions_and_metadata_are_not_read() -> None:
    segments = speak(
        "<meta name='a' content='b'/><metadata>no</metadata>"
        '<audio src="x"><desc>a dog</desc>Woof</audio>'
    )
    assert segments == (Sound("x", (Speech("Woof"),), names_only=True),)


def test_comments_processing_instructions_and_cdata() -> None:
    assert speak("A<!-- hidden --><?pi x?><![CDATA[ <b> & ]]>B") == (Speech("A & B"),)


def test_the_root_must_be_speak() -> None:
    assert "root" in rejected("<p>Hi</p>").detail


# ---- detection ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<speak>Hi</speak>", True),
        ("  \n\ufeff<speak version='1.1'>", True),
        ("<speak/>", True),
        ('<?xml version="1.0" encoding="UTF-8"?>\n<speak>', True),
        ("<speaker>Hi</speaker>", False),
        ("Say <speak>", False),
        ('{"text": "<speak>"}', False),
        ("", False),
    ],
)
def test_is_ssml(text: str, expected: bool) -> None:
    assert is_ssml(text) is expected


# ---- hostile documents --------------------------------------------------------------------


def bounded_rejection(document: str) -> SsmlError:
    """Parse a hostile document: it must be refused within a small memory peak."""
    tracemalloc.start()
    try:
        with pytest.raises(SsmlError) as caught:
            parse_ssml(document)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, peak
    return caught.value


def test_billion_laughs_is_refused() -> None:
    entities = ['<!ENTITY lol "lol">'] + [
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">'
        for i in range(1, 10)
    ]
    document = f"<?xml version='1.0'?><!DOCTYPE speak [{''.join(entities)}]><speak>&lol9;</speak>"
    err = bounded_rejection(document)
    assert "DTD" in err.detail
    assert err.line == 1


def test_an_external_entity_is_refused() -> None:
    document = '<!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><speak>&xxe;</speak>'
    assert "DTD" in bounded_rejection(document).detail


def test_a_dtd_alone_is_refused() -> None:
    document = '<!DOCTYPE speak SYSTEM "http://127.0.0.1:9/speak.dtd"><speak>Hi</speak>'
    assert "DTD" in bounded_rejection(document).detail


def test_an_undeclared_entity_is_refused() -> None:
    err = bounded_rejection("<speak>\n&xxe;</speak>")
    assert (err.line, err.column) == (2, 1)


def test_ten_thousand_nested_elements_are_refused_at_the_depth_limit() -> None:
    document = "<speak>" + "<s>" * 10_000 + "x"  # never closed: refused before the end
    assert len(document) < MAX_SSML_CHARS
    err = bounded_rejection(document)
    assert "deep" in err.detail
    assert err.column == len("<speak>") + 3 * (MAX_DEPTH - 1) + 1  # the first element too deep


def test_nesting_up_to_the_limit_is_fine() -> None:
    depth = MAX_DEPTH - 1
    assert speak("<emphasis>" * depth + "ok" + "</emphasis>" * depth) == (Speech("ok"),)


def test_too_many_elements_are_refused() -> None:
    err = bounded_rejection("<speak>" + "<mark/>" * MAX_ELEMENTS + "</speak>")
    assert "elements" in err.detail


def test_a_huge_attribute_is_refused() -> None:
    err = bounded_rejection('<speak><audio src="' + "a" * 60_000 + '"/></speak>')
    assert "src" in err.detail


def test_error_details_stay_short_whatever_the_input() -> None:
    long = "x" * 250
    for document in (
        f'<speak><break time="{long}"/></speak>',
        f'<speak><prosody rate="{long}">a</prosody></speak>',
        f'<speak><voice name="{long}">a</voice></speak>',
        f"<{'y' * 60_000}/>",
        f"<speak><audio {'z' * 60_000}='{'v' * 300}'/></speak>",
    ):
        assert len(rejected(document).detail) < 200


def test_too_many_attributes_are_refused() -> None:
    attributes = " ".join(f'a{i}="1"' for i in range(5000))
    assert "attributes" in bounded_rejection(f"<speak {attributes}/>").detail


def test_an_oversized_document_is_refused_before_parsing() -> None:
    document = "<speak>" + "a" * MAX_SSML_CHARS + "</speak>"
    tracemalloc.start()
    try:
        with pytest.raises(SsmlError) as caught:
            parse_ssml(document)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # not even encoded
    assert str(MAX_SSML_CHARS) in caught.value.detail


def test_the_size_limit_can_be_lowered() -> None:
    assert parse_ssml("<speak>Hi</speak>", max_chars=17) == (Speech("Hi"),)
    with pytest.raises(SsmlError):
        parse_ssml("<speak>Hi</speak>", max_chars=16)


@pytest.mark.parametrize(
    ("document", "line", "column"),
    [
        ("<speak>Hi</spek>", 1, 12),
        ("<speak>\n  <s>Hi\n</speak>", 3, 3),
        ("<speak>Hi", 1, 10),
        ("<speak>Hi</speak> trailing", 1, 19),
        ("\n\n   <speak a='1' a='2'/>", 3, 17),
        ("<speak>a\x00b</speak>", 1, 9),
        ("<speak>a\ud800b</speak>", 1, 9),
    ],
)
def test_invalid_xml_is_refused_with_its_position(document: str, line: int, column: int) -> None:
    err = rejected(document)
    assert (err.line, err.column) == (line, column), err
    assert f"line {line}, column {column}" in str(err)


# ---- fuzzing ------------------------------------------------------------------------------

TAGS = ["speak", "break", "prosody", "say-as", "sub", "p", "s", "voice", "audio", "emphasis"]
TAGS += ["desc", "mark", "phoneme", "x"]
ATTRIBUTES = ["time", "strength", "rate", "volume", "interpret-as", "format", "alias", "name"]
ATTRIBUTES += ["speaker", "src", "ph"]
VALUES = ["500ms", "2s", "x", "weak", "slow", "150%", "+6dB", "-90dB", "loud", "0.8", "0%"]
VALUES += ["characters", "digits", "cardinal", "ordinal", "date", "time", "telephone", "dmy"]
VALUES += ["12:30", "a#2", "#", "bell", "", "&amp;", "&x;", "<", "[[", "\u0000", "99999999%"]
WORDS = ["Hi", "123", "2024-03-05", "14:05", "+1 555", "A.B", "[[", "]]", "&lt;", "&", " ", "\n"]
WORDS += ["\u200b", "<!--", "-->", "<![CDATA[", "]]>", "<!DOCTYPE x>", "é", "\ufeff", "\ud800"]

attribute = st.tuples(st.sampled_from(ATTRIBUTES), st.sampled_from(VALUES) | st.text(max_size=6))
tokens = st.one_of(
    st.sampled_from(WORDS),
    st.text(max_size=8),
    st.builds(
        lambda tag, attrs, closed: (
            "<" + tag + "".join(f' {k}="{v}"' for k, v in attrs) + ("/>" if closed else ">")
        ),
        st.sampled_from(TAGS),
        st.lists(attribute, max_size=3),
        st.booleans(),
    ),
    st.sampled_from(TAGS).map(lambda tag: f"</{tag}>"),
)
soups = st.lists(tokens, max_size=40).map("".join)


def check_segments(segments: tuple[Segment, ...]) -> None:
    for segment in segments:
        if isinstance(segment, Speech):
            assert segment.text
            assert clean_text(segment.text) == segment.text
            assert "[[" not in segment.text
            assert MIN_RATE <= segment.rate <= MAX_RATE
            assert 0 <= segment.volume <= 1
        elif isinstance(segment, Pause):
            assert 0 < segment.seconds <= MAX_PAUSE
        else:
            assert segment.name
            assert 0 <= segment.volume <= 1
            check_segments(segment.fallback)


def outcome(document: str) -> tuple[Segment, ...] | SsmlError:
    try:
        return parse_ssml(document)
    except SsmlError as err:
        return err


def check_outcome(result: tuple[Segment, ...] | SsmlError) -> None:
    if isinstance(result, SsmlError):
        assert result.reason == "invalid_ssml"
        assert result.line >= 1
        assert result.column >= 1
        assert len(result.detail) <= 300
    else:
        check_segments(result)


@FUZZ
@given(soups, st.booleans())
def test_tag_soup_gives_segments_or_the_documented_error(soup: str, wrap: bool) -> None:
    check_outcome(outcome(f"<speak>{soup}</speak>" if wrap else soup))


@FUZZ
@given(st.text(max_size=300))
def test_random_text_gives_segments_or_the_documented_error(text: str) -> None:
    check_outcome(outcome(text))
    check_outcome(outcome(f"<speak>{text}</speak>"))
