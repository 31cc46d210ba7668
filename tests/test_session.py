"""The session state machine, without I/O: messages in, effects out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamtts.limits import Limits
from streamtts.options import SynthesisOptions
from streamtts.protocol import (
    AudioFormat,
    CancelMessage,
    EndMessage,
    ErrorCode,
    FlushMessage,
    StartMessage,
    TextMessage,
)
from streamtts.segmenter import SegmenterOptions
from streamtts.session import (
    CancelContext,
    Effect,
    OpenContext,
    PrepareSegment,
    QueueEnd,
    QueueFlushMark,
    QueueSegment,
    Send,
    Session,
)

NOW = 1000.0


def make_session(max_contexts: int = 4, max_chars: int = 1000) -> Session:
    return Session(
        voices=frozenset({"v1", "v2"}),
        default_voice="v1",
        segmenter_options=SegmenterOptions(max_buffer_delay_ms=500),
        limits=Limits(max_contexts_per_socket=max_contexts, max_text_per_context_chars=max_chars),
    )


def error_codes(effects: list[Effect]) -> list[str]:
    return [
        str(e.message["code"])
        for e in effects
        if isinstance(e, Send) and e.message["type"] == "error"
    ]


def test_start_opens_a_context_with_the_default_voice() -> None:
    session = make_session()
    effects = session.handle(StartMessage("c"), NOW)
    assert effects == [OpenContext("c", "v1", AudioFormat(), SynthesisOptions())]
    assert session.active_contexts == 1


def test_start_with_alias_and_explicit_voice() -> None:
    session = make_session()
    assert session.handle(StartMessage("a", "default"), NOW) == [
        OpenContext("a", "v1", AudioFormat(), SynthesisOptions())
    ]
    options = SynthesisOptions(speed=1.2)
    assert session.handle(StartMessage("b", "v2", options=options), NOW) == [
        OpenContext("b", "v2", AudioFormat(), options)
    ]


def test_text_flush_end_flow() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    assert session.handle(TextMessage("c", "Hello wor"), NOW) == []
    assert session.handle(TextMessage("c", "ld"), NOW) == []
    assert session.handle(FlushMessage("c"), NOW) == [
        QueueSegment("c", "Hello world"),
        QueueFlushMark("c"),
    ]
    session.handle(TextMessage("c", "Bye"), NOW)
    assert session.handle(EndMessage("c"), NOW) == [QueueSegment("c", "Bye"), QueueEnd("c")]
    # Ending: no more text, but the context is counted until the shell reports it finished.
    assert error_codes(session.handle(TextMessage("c", "more"), NOW)) == ["context_ended"]
    assert session.active_contexts == 1
    session.context_finished("c")
    assert session.active_contexts == 0
    assert error_codes(session.handle(TextMessage("c", "x"), NOW)) == ["unknown_context"]


def test_complete_sentences_are_queued_without_flush() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    effects = session.handle(TextMessage("c", "This sentence is long enough to go. And"), NOW)
    assert effects == [QueueSegment("c", "This sentence is long enough to go.")]


def test_a_likely_next_segment_is_prepared_once_before_it_is_queued() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    assert session.handle(TextMessage("c", "Sure, I can help with that"), NOW) == []
    sentence = "Sure, I can help with that."
    assert session.handle(TextMessage("c", "."), NOW) == [PrepareSegment("c", sentence)]
    assert session.handle(TextMessage("c", " "), NOW) == []  # the same: not again
    assert session.handle(TextMessage("c", "The"), NOW) == [QueueSegment("c", sentence)]
    # Refuted: a lowercase word goes on with the sentence; nothing is queued for it.
    assert session.handle(TextMessage("c", " train is late."), NOW) == [
        PrepareSegment("c", "The train is late.")
    ]
    assert session.handle(TextMessage("c", " and"), NOW) == []
    assert session.handle(FlushMessage("c"), NOW) == [
        QueueSegment("c", "The train is late. and"),
        QueueFlushMark("c"),
    ]


def test_cancel_removes_the_context_at_once_and_frees_the_id() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    session.handle(TextMessage("c", "Some text"), NOW)
    assert session.handle(CancelMessage("c"), NOW) == [CancelContext("c")]
    assert session.active_contexts == 0
    assert session.handle(StartMessage("c"), NOW) == [
        OpenContext("c", "v1", AudioFormat(), SynthesisOptions())
    ]


def test_cancel_is_accepted_while_ending() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    session.handle(EndMessage("c"), NOW)
    assert session.handle(CancelMessage("c"), NOW) == [CancelContext("c")]


def test_errors_leave_the_session_usable() -> None:
    session = make_session(max_contexts=1, max_chars=10)
    assert error_codes(session.handle(StartMessage("c", "nobody"), NOW)) == ["unknown_voice"]
    session.handle(StartMessage("c"), NOW)
    assert error_codes(session.handle(StartMessage("c"), NOW)) == ["context_exists"]
    assert error_codes(session.handle(StartMessage("d"), NOW)) == ["too_many_contexts"]
    assert error_codes(session.handle(TextMessage("c", "x" * 11), NOW)) == ["text_too_long"]
    # The rejected text was not added: ten characters still fit.
    assert session.handle(TextMessage("c", "abcdefghij"), NOW) == []
    assert session.handle(FlushMessage("c"), NOW) == [
        QueueSegment("c", "abcdefghij"),
        QueueFlushMark("c"),
    ]
    for code in (ErrorCode.UNKNOWN_CONTEXT,):
        assert error_codes(session.handle(FlushMessage("zzz"), NOW)) == [code.value]


def test_buffered_text_is_spoken_after_the_maximum_delay() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    session.handle(TextMessage("c", "waiting for more words"), NOW)
    deadline = session.next_deadline_ms()
    assert deadline is not None and NOW < deadline <= NOW + 500
    assert session.poll(NOW + 100) == []
    effects = session.poll(NOW + 600)
    assert effects and all(isinstance(e, QueueSegment) for e in effects)
    assert " ".join(e.text for e in effects if isinstance(e, QueueSegment)).startswith("waiting")


def test_the_delay_waits_while_the_context_is_still_speaking() -> None:
    session = make_session()
    session.handle(StartMessage("c"), NOW)
    session.handle(TextMessage("c", "an unfinished thought"), NOW)
    assert session.poll(NOW + 600, busy={"c"}) == []
    assert session.poll(NOW + 700, busy=set()) != []


def test_close_cancels_everything() -> None:
    session = make_session()
    session.handle(StartMessage("a"), NOW)
    session.handle(StartMessage("b"), NOW)
    assert sorted(session.close(), key=str) == [CancelContext("a"), CancelContext("b")]
    assert session.active_contexts == 0


# ---- random message orders -----------------------------------------------------------------

CONTEXT_IDS = st.sampled_from(["a", "b", "c", "d", "e"])
MESSAGES = st.one_of(
    st.builds(StartMessage, CONTEXT_IDS, st.sampled_from([None, "v1", "v2", "nobody", "default"])),
    st.builds(TextMessage, CONTEXT_IDS, st.text(max_size=80)),
    st.builds(FlushMessage, CONTEXT_IDS),
    st.builds(EndMessage, CONTEXT_IDS),
    st.builds(CancelMessage, CONTEXT_IDS),
)
# Steps: a client message, the clock moving on, or the shell reporting a context finished.
STEPS = st.lists(
    st.one_of(
        MESSAGES,
        st.floats(0, 2000).map(lambda ms: ("tick", ms)),
        CONTEXT_IDS.map(lambda c: ("finished", c)),
    ),
    max_size=60,
)
DOCUMENTED = {code.value for code in ErrorCode}


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_random_message_orders_keep_the_session_consistent(steps: list[object]) -> None:
    session = make_session(max_contexts=3, max_chars=200)
    open_ids: set[str] = set()  # what the shell would have runners for
    now = NOW
    for step in steps:
        if isinstance(step, tuple) and step[0] == "tick":
            now += step[1]
            effects = session.poll(now)
        elif isinstance(step, tuple) and step[0] == "finished":
            # The shell only reports contexts it runs, once they ended.
            if step[1] in open_ids:
                session.context_finished(step[1])
                open_ids.discard(step[1])
            continue
        else:
            assert not isinstance(step, tuple)
            effects = session.handle(step, now)  # type: ignore[arg-type]
        for effect in effects:
            if isinstance(effect, OpenContext):
                assert effect.context not in open_ids
                assert effect.voice in {"v1", "v2"}
                open_ids.add(effect.context)
            elif isinstance(effect, CancelContext):
                assert effect.context in open_ids
                open_ids.discard(effect.context)
            elif isinstance(effect, QueueSegment | PrepareSegment | QueueFlushMark | QueueEnd):
                assert effect.context in open_ids
            else:
                assert isinstance(effect, Send) and effect.message["type"] == "error"
                assert effect.message["code"] in DOCUMENTED
        assert session.active_contexts == len(open_ids) <= 3
    closing = session.close()
    assert {e.context for e in closing if isinstance(e, CancelContext)} == open_ids
    assert session.active_contexts == 0
