"""The Wyoming event → session translation, without sockets: Home Assistant's plain and
streaming sequences, the compatibility ``synthesize`` that must not be spoken twice, voices,
errors (each answered, then the connection closed) and requests that wait their turn."""

from __future__ import annotations

from typing import Any

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from streamtts.engine.base import VoiceInfo
from streamtts.limits import Limits
from streamtts.protocol import AudioFormat, done, error, segment, started
from streamtts.segmenter import SegmenterOptions
from streamtts.session import CancelContext, OpenContext, QueueEnd, QueueSegment
from streamtts.wyoming.conversation import (
    MAX_WAITING_EVENTS,
    Action,
    CloseConnection,
    Conversation,
    SendEvent,
)
from streamtts.wyoming.info import MULTILINGUAL_LANGUAGES

RATE_HZ = 22_050
VOICES = [
    VoiceInfo("en_US-joe-medium", "en_US-joe-medium", "en-US", "piper", "Piper voice"),
    VoiceInfo("de_DE-thorsten", "Thorsten", "de-DE", "piper"),
    VoiceInfo("fish-multi", "Fish-Speech voice", "multi", "fish"),
]


def conversation(limits: Limits | None = None) -> Conversation:
    return Conversation(
        lambda: VOICES, "en_US-joe-medium", RATE_HZ, SegmenterOptions(), limits or Limits()
    )


def sent(actions: list[Action]) -> list[Event]:
    return [a.event for a in actions if isinstance(a, SendEvent)]


def the_error(actions: list[Action]) -> Error:
    events = sent(actions)
    assert len(events) == 1 and Error.is_type(events[0].type), events
    assert isinstance(actions[-1], CloseConnection)
    return Error.from_event(events[0])


def segments(actions: list[Action]) -> list[str]:
    return [a.text for a in actions if isinstance(a, QueueSegment)]


def finish(conv: Conversation, **message: Any) -> list[Action]:
    return conv.on_message(done(conv.context, "end", {}) | message, 0.0)


def test_describe_lists_one_installed_streaming_program_with_every_voice() -> None:
    actions = conversation().handle(Describe().event(), 0.0)
    info = Info.from_event(sent(actions)[0])  # parsed as Home Assistant parses it
    (program,) = info.tts
    assert program.installed and program.supports_synthesize_streaming
    assert program.name == "streamtts" and program.version
    assert [v.name for v in program.voices] == [v.id for v in VOICES]
    assert all(v.installed for v in program.voices)
    assert program.voices[0].languages == ["en-US"]
    assert program.voices[2].languages == list(MULTILINGUAL_LANGUAGES)
    assert program.voices[1].description == "Thorsten"  # what Home Assistant shows


def test_plain_synthesize_is_one_context_with_one_audio_group() -> None:
    conv = conversation()
    actions = conv.handle(Synthesize(text="Hello there. How are you today?").event(), 0.0)
    opened = actions[0]
    assert isinstance(opened, OpenContext)
    assert opened.voice == "en_US-joe-medium"
    assert opened.format == AudioFormat("pcm_s16le", RATE_HZ)
    assert segments(actions) == ["Hello there.", "How are you today?"]
    assert isinstance(actions[-1], QueueEnd) and conv.busy

    start = sent(conv.on_message(started(conv.context, opened.format), 0.0))
    assert AudioStart.from_event(start[0]) == AudioStart(RATE_HZ, 2, 1, timestamp=0)
    first = conv.audio(b"\x00\x01" * 100, 50.0).event
    second = conv.audio(b"\x00\x01" * 100, 50.0).event
    assert AudioChunk.from_event(first).rate == RATE_HZ
    assert [AudioChunk.from_event(c).timestamp for c in (first, second)] == [0, 50]
    assert conv.on_message(segment(conv.context, "Hello there.", 0, 100), 0.0) == []
    end = sent(finish(conv))
    assert [e.type for e in end] == ["audio-stop"]  # Home Assistant stops at the first one
    assert AudioStop.from_event(end[0]).timestamp == 100
    assert not conv.busy and not conv.closed


def test_streaming_speaks_as_chunks_arrive_and_ignores_the_compatibility_synthesize() -> None:
    conv = conversation()
    actions = conv.handle(SynthesizeStart().event(), 0.0)
    assert [type(a) for a in actions] == [OpenContext]
    spoken: list[str] = []
    for chunk in ["Hello", " there,", " my friend.", " How are", " you?"]:
        spoken += segments(conv.handle(SynthesizeChunk(text=chunk).event(), 0.0))
    assert spoken == ["Hello there, my friend."]  # before synthesize-stop: audio starts now
    whole = "Hello there, my friend. How are you?"
    assert conv.handle(Synthesize(text=whole).event(), 0.0) == []  # not spoken again
    stop = conv.handle(SynthesizeStop().event(), 0.0)
    assert segments(stop) == ["How are you?"] and isinstance(stop[-1], QueueEnd)
    assert [e.type for e in sent(finish(conv))] == ["audio-stop", "synthesize-stopped"]
    assert not conv.busy


def test_text_waiting_past_the_buffer_delay_is_spoken_by_poll() -> None:
    conv = conversation()
    conv.handle(SynthesizeStart().event(), 0.0)
    assert segments(conv.handle(SynthesizeChunk(text="Well then ").event(), 0.0)) == []
    assert segments(conv.poll(100.0, busy=False)) == []
    assert segments(conv.poll(2000.0, busy=True)) == []  # still speaking: no hurry
    assert segments(conv.poll(2000.0, busy=False)) == ["Well then"]


def test_voices_by_name_and_by_language() -> None:
    def voice_of(voice: SynthesizeVoice) -> str:
        opened = conversation().handle(Synthesize(text="Hi.", voice=voice).event(), 0.0)[0]
        assert isinstance(opened, OpenContext), opened
        return opened.voice

    assert voice_of(SynthesizeVoice(name="de_DE-thorsten")) == "de_DE-thorsten"
    assert voice_of(SynthesizeVoice(language="de_DE")) == "de_DE-thorsten"
    assert voice_of(SynthesizeVoice(language="en")) == "en_US-joe-medium"
    assert voice_of(SynthesizeVoice(language="ja")) == "fish-multi"  # the multilingual voice


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event(), "unknown_voice"),
        (Synthesize(text="Hi.", voice=SynthesizeVoice(language="xx")).event(), "unknown_voice"),
        (
            Synthesize(text="Hi.", voice=SynthesizeVoice(name="fish-multi", speaker="p1")).event(),
            "invalid_field",
        ),
        (Event("synthesize", {"text": 5}), "invalid_field"),
        (Event("synthesize", {}), "missing_field"),
        (Event("synthesize", {"text": "Hi.", "voice": "joe"}), "invalid_field"),
        (Event("synthesize", {"text": "Hi.", "voice": {"name": 3}}), "invalid_field"),
        (Event("synthesize", {"text": "<speak/>", "text_format": "ssml"}), "invalid_field"),
        (SynthesizeChunk(text="orphan").event(), "invalid_message"),
        (SynthesizeStop().event(), "invalid_message"),
        (Synthesize(text="x" * 101).event(), "text_too_long"),
    ],
)
def test_bad_requests_are_answered_with_an_error_then_closed(event: Event, code: str) -> None:
    conv = conversation(Limits(max_text_per_context_chars=100))
    actions = conv.handle(event, 0.0)
    assert the_error(actions).code == code
    assert not any(isinstance(a, OpenContext) for a in actions)
    assert conv.closed and conv.handle(Describe().event(), 0.0) == []


def test_an_error_in_a_streaming_request_stops_its_audio() -> None:
    conv = conversation(Limits(max_text_per_message_chars=10))
    conv.handle(SynthesizeStart().event(), 0.0)
    actions = conv.handle(SynthesizeChunk(text="far too long for it").event(), 0.0)
    assert the_error(actions[:1] + actions[-1:]).code == "text_too_long"
    assert CancelContext(conv.context) in actions
    conv2 = conversation()
    conv2.handle(SynthesizeStart().event(), 0.0)
    assert the_error(conv2.handle(SynthesizeStart().event(), 0.0)[:1] + [CloseConnection()])


def test_runner_errors_and_shutdown_end_the_connection() -> None:
    conv = conversation()
    conv.handle(Synthesize(text="Hi.").event(), 0.0)
    failed = conv.on_message(error("internal", "synthesis failed", conv.context), 0.0)
    assert the_error(failed).code == "internal"
    assert conv.on_message(done(conv.context, "error", {}), 0.0) == []

    conv = conversation()
    conv.handle(SynthesizeStart().event(), 0.0)
    assert conv.shutting_down() == []  # the shell cancels the response; its done follows
    ended = conv.on_message(done(conv.context, "shutdown", {}), 0.0)
    assert the_error(ended).code == "shutting_down"
    assert the_error(conversation().shutting_down()).code == "shutting_down"  # idle


def test_unknown_events_are_dropped_and_ping_is_answered() -> None:
    conv = conversation()
    assert conv.handle(Event("transcribe", {"language": "en"}), 0.0) == []
    assert conv.handle(Event("audio-chunk", {"rate": 1}), 0.0) == []
    (pong,) = sent(conv.handle(Ping(text="hi").event(), 0.0))
    assert pong.type == "pong" and pong.data == {"text": "hi"}
    assert not conv.closed


def test_requests_that_arrive_during_a_response_wait_their_turn_in_order() -> None:
    conv = conversation()
    first = conv.handle(Synthesize(text="One.").event(), 0.0)
    first_context = conv.context
    assert segments(first) == ["One."]
    # A client that does not wait for audio-stop: the next requests wait.
    assert conv.handle(Describe().event(), 0.0) == []
    assert conv.handle(SynthesizeStart().event(), 0.0) == []
    assert conv.handle(SynthesizeChunk(text="Two.").event(), 0.0) == []
    assert conv.handle(SynthesizeStop().event(), 0.0) == []
    actions = finish(conv)
    kinds = [e.type for e in sent(actions)]
    assert kinds == ["audio-stop", "info"]
    assert conv.context != first_context  # each request is a context of its own
    assert segments(actions) == ["Two."] and isinstance(actions[-1], QueueEnd)
    assert [e.type for e in sent(finish(conv))] == ["audio-stop", "synthesize-stopped"]


def test_waiting_is_bounded() -> None:
    conv = conversation()
    conv.handle(Synthesize(text="One.").event(), 0.0)
    for _ in range(MAX_WAITING_EVENTS):
        assert conv.handle(Describe().event(), 0.0) == []
    assert the_error(conv.handle(Describe().event(), 0.0)[:1] + [CloseConnection()])
