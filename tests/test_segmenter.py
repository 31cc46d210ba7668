"""Tests for streamtts.segmenter."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from streamtts.segmenter import SegmenterOptions, TextSegmenter

DEFAULTS = SegmenterOptions()


def segment(text: str, chunk_chars: int | None = None, **options: int) -> list[str]:
    """Push ``text`` whole (or in chunks of ``chunk_chars``) at t=0, then flush."""
    seg = TextSegmenter(dataclasses.replace(DEFAULTS, **options))
    out: list[str] = []
    if chunk_chars is None:
        out += seg.push(text, 0.0)
    else:
        for i in range(0, len(text), chunk_chars):
            out += seg.push(text[i : i + chunk_chars], 0.0)
    return out + seg.flush()


def push_pieces(pieces: list[str], options: SegmenterOptions = DEFAULTS) -> list[str]:
    seg = TextSegmenter(options)
    out: list[str] = []
    for piece in pieces:
        out += seg.push(piece, 0.0)
    return out + seg.flush()


def non_ws(s: str) -> str:
    return "".join(s.split())


# --------------------------------------------------------------------------------------------
# Sentence ends and their exceptions
# --------------------------------------------------------------------------------------------


def test_sentences() -> None:
    text = "Hello there. How are you today? I am fine, thanks! Great to hear… Bye now."
    assert segment(text) == [
        "Hello there.",
        "How are you today?",
        "I am fine, thanks!",
        "Great to hear…",
        "Bye now.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Dr. Smith and Mr. Jones met Mrs. Brown and Ms. Green at St. Mary's church.",
        "Prof. Jones argued that Python vs. Rust is not the point here at all.",
        "Bring fruit, e.g. apples, and read the docs, i.e. the manual, very carefully.",
        "Bring fruit, e.g. Apples and Pears, and read it, i.e. The Manual, carefully.",
        "The U.S. Army and the U.K. Navy held a very long joint exercise yesterday.",
        "He has lived in the U.S. since 1999 and likes it there very much indeed.",
        "J. R. R. Tolkien wrote The Lord of the Rings over many, many long years.",
        "It costs $19.99 or about 3.14 times the old price of the product, he said.",
        "We meet at 3:45 p.m. on the dot to discuss things, like the budget for 2025.",
        "Apples, pears, etc. are all fine to bring to the picnic on Saturday afternoon.",
        'She said "Wait!" and then she left the room without another word to him.',
        "Well... maybe we should go now before it gets far too dark outside to see.",
        "See Fig. 3 and No. 12 on p. 7 for the details of the very long experiment.",
        "Visit example.com or www.test.org/page.html to learn more about the project.",
        "The value went from 1,000.50 to 2,500.75 in a single day of heavy trading.",
    ],
)
def test_no_split_inside_sentence(text: str) -> None:
    # (no clause cut for the first segment here: only sentence ends are tested)
    assert segment(text, first_segment_min_chars=250) == [text]
    assert segment(text, 1, first_segment_min_chars=250) == [text]


def test_etc_before_uppercase_ends_sentence() -> None:
    text = "We bought apples, pears, etc. Then we went home to rest."
    assert segment(text, first_segment_min_chars=250) == [
        "We bought apples, pears, etc.",
        "Then we went home to rest.",
    ]


def test_ellipsis_before_uppercase_ends_sentence() -> None:
    assert segment("I was thinking... Maybe we should go now.") == [
        "I was thinking...",
        "Maybe we should go now.",
    ]


def test_closing_quotes_and_brackets() -> None:
    text = 'He said "Stop." Then he left (quietly.) After that, silence [mostly.] The end.'
    assert segment(text) == [
        'He said "Stop."',
        "Then he left (quietly.)",
        "After that, silence [mostly.]",
        "The end.",
    ]


def test_period_waits_for_the_next_characters() -> None:
    seg = TextSegmenter()
    assert seg.push("It is 3.", 0.0) == []  # could be 3.14
    assert seg.push("14 now", 0.0) == []
    assert seg.push(". ", 0.0) == []  # a lowercase word could follow
    assert seg.push("Next one", 0.0) == ["It is 3.14 now."]
    seg2 = TextSegmenter()
    assert seg2.push("I live in the U.", 0.0) == []
    assert seg2.push("S. It", 0.0) == []  # never split after U.S.
    assert seg2.flush() == ["I live in the U.S. It"]


def test_question_mark_decided_by_next_word() -> None:
    seg = TextSegmenter()
    assert seg.push("Why?", 0.0) == []
    assert seg.push(" ", 0.0) == []
    assert seg.push("Because", 0.0) == ["Why?"]


def test_list_numbers() -> None:
    text = "Steps:\n1. Preheat the oven.\n2. Mix the flour and sugar.\n3. Bake it."
    assert segment(text) == [
        "Steps:",
        "1. Preheat the oven.",
        "2. Mix the flour and sugar.",
        "3. Bake it.",
    ]


def test_newlines_are_boundaries() -> None:
    assert segment("First paragraph without a stop\n\nSecond paragraph here\nThird line") == [
        "First paragraph without a stop",
        "Second paragraph here",
        "Third line",
    ]


def test_cjk() -> None:
    text = "你好。今天天气很好！我们去公园吧？好的，我们走吧。"
    assert segment(text, min_segment_chars=0) == [
        "你好。",
        "今天天气很好！",
        "我们去公园吧？",
        "好的，我们走吧。",
    ]
    # Chunking: the terminator is decided once the next character shows no closer follows.
    seg = TextSegmenter(dataclasses.replace(DEFAULTS, min_segment_chars=0))
    assert seg.push("「你好。", 0.0) == []
    assert seg.push("」他说", 0.0) == ["「你好。」"]
    assert seg.flush() == ["他说"]


def test_cjk_clause_for_first_segment() -> None:
    text = "这是一个非常长的句子，它有很多很多的字，我们希望尽快开始说话，然后继续说完。"
    out = segment(text, first_segment_min_chars=8)
    assert out[0] == "这是一个非常长的句子，"
    assert "".join(out) == text


# --------------------------------------------------------------------------------------------
# Lengths: short first segment, merging, long sentences
# --------------------------------------------------------------------------------------------


def test_first_segment_is_cut_at_a_clause() -> None:
    text = (
        "Well, I have been thinking about this for a while, and I believe that we should go "
        "ahead with the plan, because it is the best option we have."
    )
    out = segment(text)
    # "Well," is shorter than first_segment_min_chars: the first clause boundary after it.
    assert out[0] == "Well, I have been thinking about this for a while,"
    assert out[1] == (
        "and I believe that we should go ahead with the plan, because it is the best option "
        "we have."
    )


def test_first_segment_short_sentence_and_reset_after_flush() -> None:
    seg = TextSegmenter()
    assert seg.push("Hi. ", 0.0) == []
    assert seg.push("Yes, sure, I can do that for you, no problem at all. Ok", 0.0) == [
        "Hi.",
        "Yes, sure, I can do that for you, no problem at all.",
    ]
    assert seg.flush() == ["Ok"]
    # After a flush the next segment may be short again.
    assert seg.push("Right. And then, of course, more text follows here", 0.0) == ["Right."]


def test_short_later_sentences_are_merged() -> None:
    assert segment("Hello there. Yes. No. Maybe so, I guess. Ok.") == [
        "Hello there.",
        "Yes. No. Maybe so, I guess.",
        "Ok.",
    ]
    assert segment("Hello there. Yes. No.", min_segment_chars=0) == [
        "Hello there.",
        "Yes.",
        "No.",
    ]


def test_long_sentence_cut_at_clause() -> None:
    clause = "this clause goes on and on for quite a while"
    text = "Start. " + "; ".join([clause.capitalize()] + [clause] * 7) + "."
    out = segment(text, max_segment_chars=120)
    assert out[0] == "Start."
    assert all(len(s) <= 120 for s in out)
    assert all(s.endswith((";", ".")) for s in out)
    assert non_ws("".join(out)) == non_ws(text)


@pytest.mark.parametrize("dash", ["—", " – ", " - "])
def test_long_sentence_cut_at_dash(dash: str) -> None:
    text = "Start. Some " + dash.join(["words in a row here"] * 10) + "."
    out = segment(text, max_segment_chars=60)
    assert all(len(s) <= 60 for s in out)
    assert all(s.endswith((dash.strip(), ".")) for s in out)
    assert non_ws("".join(out)) == non_ws(text)


def test_long_sentence_without_clauses_cut_at_space() -> None:
    words = [f"word{i}" for i in range(100)]
    text = "Start. " + " ".join(words).capitalize() + "."
    out = segment(text, max_segment_chars=50)
    assert all(len(s) <= 50 for s in out)
    assert " ".join(out) == text  # cut between words only
    assert all(w in words or w in ("Start.", "Word0", "word99.") for s in out for w in s.split())


def test_no_spaces_at_all_is_hard_cut() -> None:
    text = "x" * 130
    assert segment(text, max_segment_chars=50) == ["x" * 50, "x" * 50, "x" * 30]
    cjk = "字" * 120
    assert segment(cjk, max_segment_chars=50) == ["字" * 50, "字" * 50, "字" * 20]


def test_long_segment_decided_while_streaming() -> None:
    seg = TextSegmenter(dataclasses.replace(DEFAULTS, max_segment_chars=30))
    out: list[str] = []
    text = "one two three four five six seven eight nine ten eleven twelve"
    for word in text.split(" "):
        out += seg.push(word + " ", 0.0)
    assert out and all(len(s) <= 30 for s in out)
    assert " ".join(out + seg.flush()) == text


# --------------------------------------------------------------------------------------------
# Output normalisation, flush, punctuation-only text
# --------------------------------------------------------------------------------------------


def test_whitespace_is_normalised() -> None:
    assert segment("  Hello \t  big\u00a0 world.   How   are you?  ") == [
        "Hello big world.",
        "How are you?",
    ]


def test_punctuation_only_is_not_emitted() -> None:
    assert segment("...") == []
    assert segment("   ") == []
    assert segment("") == []
    # Trailing punctuation is attached to the previous segment when both come out together.
    assert segment("Hello there. ... !!!", min_segment_chars=0) == ["Hello there."]
    assert segment("Hello there! Ok ... !!!") == ["Hello there!", "Ok ... !!!"]
    seg0 = TextSegmenter()
    assert seg0.push("Hello there.", 0.0) == []
    assert seg0.flush() == ["Hello there."]
    assert TextSegmenter().flush() == []
    seg1 = TextSegmenter()
    seg1.push("One two", 0.0)
    assert seg1.flush() == ["One two"]
    assert seg1.push("Three four. ...", 0.0) == ["Three four."]
    assert seg1.flush() == []  # the "..." alone is not sent to the model
    seg = TextSegmenter()
    assert seg.push("Hello there. Next one", 0.0) == ["Hello there."]
    assert seg.flush() == ["Next one"]
    assert seg.push(" :) ", 0.0) == []
    assert seg.flush() == []  # nothing speakable, nothing to attach it to


def test_leading_punctuation_stays_with_text() -> None:
    assert segment('"... And so it begins." Then more.') == [
        '"... And so it begins."',
        "Then more.",
    ]


def test_flush_emits_undecided_text() -> None:
    seg = TextSegmenter()
    assert seg.push("The price is 3.", 0.0) == []
    assert seg.flush() == ["The price is 3."]
    assert seg.buffered_text == ""
    assert seg.flush() == []
    assert seg.deadline_ms() is None


def test_reset_drops_buffer() -> None:
    seg = TextSegmenter()
    seg.push("Some text that is", 0.0)
    seg.reset()
    assert seg.buffered_text == "" and seg.deadline_ms() is None and seg.flush() == []


def test_options_validation() -> None:
    with pytest.raises(ValueError):
        SegmenterOptions(max_segment_chars=0)
    with pytest.raises(ValueError):
        SegmenterOptions(first_segment_min_chars=300, max_segment_chars=250)
    with pytest.raises(ValueError):
        SegmenterOptions(min_segment_chars=-1)
    with pytest.raises(ValueError):
        SegmenterOptions(max_buffer_delay_ms=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.max_segment_chars = 10  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# Deadline and poll
# --------------------------------------------------------------------------------------------


def test_deadline_from_first_buffered_char() -> None:
    seg = TextSegmenter(SegmenterOptions(max_buffer_delay_ms=1000.0))
    assert seg.deadline_ms() is None
    assert seg.push("   ", 100.0) == []
    assert seg.deadline_ms() is None  # whitespace only
    assert seg.push("I think that we", 200.0) == []
    assert seg.deadline_ms() == 1200.0
    assert seg.push(" should go", 900.0) == []
    assert seg.deadline_ms() == 1200.0
    assert seg.poll(1199.0) == []
    # Deadline: everything but the trailing word (it may be unfinished: "go" → "going").
    assert seg.poll(1200.0) == ["I think that we should"]
    assert seg.buffered_text == "go"
    # The kept word gets a fresh delay from the forced emission, not from its arrival.
    assert seg.deadline_ms() == 2200.0
    assert seg.push("ing home. And", 1500.0) == ["going home."]
    assert seg.deadline_ms() == 2500.0  # "And" arrived at 1500


def test_poll_prefers_a_clause_boundary_with_a_short_tail() -> None:
    seg = TextSegmenter(SegmenterOptions(max_buffer_delay_ms=500.0))
    seg.push("Hi, well, you know, the thing about it is that a short tail rem", 0.0)
    # No clause boundary ≥ 20 chars → nothing emitted by push.
    assert seg.buffered_text.startswith("Hi, well")
    out = seg.poll(600.0)
    assert out[-1].endswith("that a short tail")
    assert seg.buffered_text == "rem"
    seg2 = TextSegmenter(SegmenterOptions(max_buffer_delay_ms=500.0))
    seg2.push("So, the thing: a short tai", 0.0)
    assert seg2.poll(500.0) == ["So, the thing:"]
    assert seg2.buffered_text == "a short tai"


def test_poll_emits_a_single_word_and_complete_text() -> None:
    seg = TextSegmenter(SegmenterOptions(max_buffer_delay_ms=100.0))
    seg.push("Supercalifragilistic", 0.0)
    assert seg.poll(100.0) == ["Supercalifragilistic"]
    seg.push("It costs 3.", 200.0)
    assert seg.poll(300.0) == ["It costs 3."]
    assert seg.buffered_text == "" and seg.deadline_ms() is None


def test_next_segment_after_poll_is_first_again() -> None:
    seg = TextSegmenter(SegmenterOptions(max_buffer_delay_ms=100.0))
    assert seg.push("Hello there. ", 0.0) == []
    assert seg.push("A long and winding road", 10.0) == ["Hello there."]
    assert seg.poll(200.0) == ["A long and winding"]
    out = seg.push(" leads home, I am told by many people, so we will walk", 250.0)
    assert out == ["road leads home, I am told by many people,"]


# --------------------------------------------------------------------------------------------
# Properties: chunking invariance, no text lost
# --------------------------------------------------------------------------------------------

WORDS = [
    "hello", "world", "Dr.", "Mr.", "U.S.", "e.g.", "i.e.", "etc.", "3.14", "$19.99", "3:45",
    "1,000", "J.", "R.", "Tolkien", "the", "The", "It", "a", "and", "vs.", "St.", "No.", "7",
    "example.com", "(quietly)", '"quoted"', "你好", "世界", "it's", "—", "-", "well...",
    "…", "1.", "über", "Ça",
]  # fmt: skip
PUNCT_AFTER = ["", "", "", "", ".", ",", "!", "?", ";", ":", "...", "?!", '."', ".)", "。", "，"]
SEPARATORS = [" ", " ", " ", " ", "  ", "\n", "\n\n", "\t", ""]


@st.composite
def realistic_text(draw: st.DrawFn) -> str:
    n = draw(st.integers(1, 60))
    parts = []
    for _ in range(n):
        parts.append(draw(st.sampled_from(WORDS)))
        parts.append(draw(st.sampled_from(PUNCT_AFTER)))
        parts.append(draw(st.sampled_from(SEPARATORS)))
    return "".join(parts)


@st.composite
def text_and_cuts(draw: st.DrawFn, text_strategy: st.SearchStrategy[str]) -> list[str]:
    text = draw(text_strategy)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=30)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


OPTIONS = st.builds(
    SegmenterOptions,
    first_segment_min_chars=st.integers(0, 30),
    min_segment_chars=st.integers(0, 30),
    max_segment_chars=st.integers(30, 120),
)

ARBITRARY_TEXT = st.text(
    alphabet=st.sampled_from(list("aAbZ09 .,;:!?…。！？，、—–-\n\t\"')(]«»*_$%")), max_size=300
)


@given(pieces=text_and_cuts(realistic_text()), options=OPTIONS)
@settings(max_examples=300, deadline=None)
def test_chunking_invariance_realistic(pieces: list[str], options: SegmenterOptions) -> None:
    whole = push_pieces(["".join(pieces)], options)
    assert push_pieces(pieces, options) == whole
    assert push_pieces(list("".join(pieces)), options) == whole  # char by char


@given(pieces=text_and_cuts(ARBITRARY_TEXT), options=OPTIONS)
@settings(max_examples=300, deadline=None)
def test_chunking_invariance_arbitrary(pieces: list[str], options: SegmenterOptions) -> None:
    assert push_pieces(pieces, options) == push_pieces(["".join(pieces)], options)


@given(pieces=text_and_cuts(realistic_text()), options=OPTIONS)
@settings(max_examples=300, deadline=None)
def test_no_text_lost_realistic(pieces: list[str], options: SegmenterOptions) -> None:
    text = non_ws("".join(pieces))
    out = push_pieces(pieces, options)
    joined = non_ws("".join(out))
    # Everything comes out, except possibly trailing punctuation-only text (": —").
    assert text.startswith(joined)
    assert not any(c.isalnum() for c in text[len(joined) :])
    for s in out:
        assert s == s.strip() and "  " not in s and "\n" not in s
        assert any(ch.isalnum() for ch in s)
        assert len(s) <= options.max_segment_chars


@given(pieces=text_and_cuts(ARBITRARY_TEXT), options=OPTIONS)
@settings(max_examples=300, deadline=None)
def test_no_real_text_lost_arbitrary(pieces: list[str], options: SegmenterOptions) -> None:
    """Only punctuation-only pieces may be dropped; every letter and digit is kept, in order,
    and the output is the input's non-space text with some non-alphanumerics removed."""
    text = non_ws("".join(pieces))
    out = non_ws("".join(push_pieces(pieces, options)))
    assert [c for c in out if c.isalnum()] == [c for c in text if c.isalnum()]
    it = iter(text)
    assert all(any(c == t for t in it) for c in out)  # out is a subsequence of text
    assert all(len(s) <= options.max_segment_chars for s in push_pieces(pieces, options))
    # Nothing at all is lost when the text ends in a letter or digit.
    if text and text[-1].isalnum():
        assert out == text


@given(
    pieces=text_and_cuts(realistic_text()),
    times=st.lists(st.floats(0, 5000), min_size=1, max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_no_text_lost_with_deadlines(pieces: list[str], times: list[float]) -> None:
    """Polling at arbitrary times changes where text is cut, never what text comes out."""
    assume(len(pieces) > 1)
    seg = TextSegmenter(SegmenterOptions(max_buffer_delay_ms=300.0))
    out: list[str] = []
    now = 0.0
    for i, piece in enumerate(pieces):
        now += times[i % len(times)] / 10
        out += seg.push(piece, now)
        out += seg.poll(now)
        deadline = seg.deadline_ms()
        assert deadline is None or deadline > now
    out += seg.flush()
    text = non_ws("".join(pieces))
    joined = non_ws("".join(out))
    assert [c for c in joined if c.isalnum()] == [c for c in text if c.isalnum()]
    it = iter(text)
    assert all(any(c == t for t in it) for c in joined)  # only punctuation-only pieces dropped


@pytest.mark.parametrize(
    "unit", ["x", "word ", ".", '"', "—", "a, ", " ", "\n", "a.", "字", "...a"]
)
def test_pathological_input_costs_linear_time(unit: str) -> None:
    """Work per push is bounded by max_segment_chars, whatever the text (no quadratic rescans
    of runs of punctuation, whitespace or unbroken words)."""
    import time

    text = unit * (300_000 // len(unit))
    started_s = time.perf_counter()
    whole = push_pieces(["Hello. ", text, " End."])
    seg = TextSegmenter()
    streamed: list[str] = seg.push("Hello. ", 0.0)
    for _ in range(0, 30_000, len(unit)):  # one delta per unit
        streamed += seg.push(unit, 0.0)
    streamed += seg.flush()
    elapsed_s = time.perf_counter() - started_s
    assert elapsed_s < 10.0  # ~0.1-2 s here; a quadratic rescan takes minutes
    assert all(len(s) <= DEFAULTS.max_segment_chars for s in whole + streamed)


def test_a_likely_sentence_end_is_named_before_the_text_after_it_confirms_it() -> None:
    seg = TextSegmenter()
    assert seg.push("Sure, I can help with that.", 0.0) == []  # waits for what follows
    assert seg.likely_next() == "Sure, I can help with that."
    assert seg.push(" The train", 10.0) == ["Sure, I can help with that."]  # confirmed
    assert seg.likely_next() is None


def test_what_an_ordinary_sentence_after_it_would_not_end_is_not_likely() -> None:
    for text in ("It costs 3.", "Ask Dr.", "U.S.", "Well...", "Sure, I can", "That was:"):
        seg = TextSegmenter()
        assert seg.push(text, 0.0) == []
        assert seg.likely_next() is None, text
    seg = TextSegmenter()  # a later sentence shorter than min_segment_chars is merged
    assert seg.push("The first sentence is long. ", 0.0) == []
    assert seg.push("Ok.", 1.0) == ["The first sentence is long."]
    assert seg.likely_next() is None


@given(pieces=text_and_cuts(realistic_text()), options=OPTIONS)
@settings(max_examples=300, deadline=None)
def test_a_likely_segment_is_what_an_ordinary_sentence_after_it_confirms(
    pieces: list[str], options: SegmenterOptions
) -> None:
    """Wherever a next segment is named, text going on with a new sentence emits exactly it
    (what a prepared segment is checked against)."""
    seg = TextSegmenter(options)
    for index, piece in enumerate(pieces):
        seg.push(piece, 0.0)
        likely = seg.likely_next()
        if likely is not None:
            probe = TextSegmenter(options)
            probe.push("".join(pieces[: index + 1]), 0.0)  # the same text in one piece
            assert probe.likely_next() == likely  # chunking does not change it
            emitted = seg.push(" And so on", 1.0)
            assert emitted[:1] == [likely]
            break
