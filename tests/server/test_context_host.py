"""The context host shared by the protocol shells, without a socket: a context's ticket and
engine stream are released by the time its ``done`` reaches the shell; refusals send one error
and leave nothing behind, and effects for a refused context are dropped."""

from __future__ import annotations

import asyncio
from typing import Any

from streamtts.config import Settings
from streamtts.options import SynthesisOptions
from streamtts.protocol import AudioFormat
from streamtts.server.context_host import ContextHost
from streamtts.server.state import AppState
from streamtts.session import CancelContext, OpenContext, QueueEnd, QueueSegment
from tests.fake_engine import VOICE, FakeEngine

FORMAT = AudioFormat("pcm_s16le", 16_000)


class Shell:
    def __init__(self, state: AppState) -> None:
        self.state = state
        self.messages: list[dict[str, Any]] = []
        self.audio_bytes = 0
        self.finished: list[str] = []
        self.active_at_done: list[int] = []

    async def send_message(self, message: dict[str, Any]) -> None:
        if message["type"] == "done":
            self.active_at_done.append(self.state.admission.active)
        self.messages.append(message)

    async def send_audio(self, context: str, payload: bytes, ms: float) -> None:
        self.audio_bytes += len(payload)

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.messages]


def host_for(engine: FakeEngine, **settings: Any) -> tuple[ContextHost, Shell, AppState]:
    state = AppState(Settings().replace(**settings), engine)
    shell = Shell(state)
    host = ContextHost(state, shell.send_message, shell.send_audio, shell.finished.append)
    return host, shell, state


def opening(context: str) -> OpenContext:
    return OpenContext(context, VOICE, FORMAT, SynthesisOptions())


async def test_a_context_is_released_before_its_done_reaches_the_shell() -> None:
    engine = FakeEngine()
    host, shell, state = host_for(engine)
    await host.apply([opening("a"), QueueSegment("a", "Hello there."), QueueEnd("a")])
    assert state.admission.active == 1 and host.contexts == ["a"]
    while "done" not in shell.kinds():
        await asyncio.sleep(0.01)
    assert shell.kinds() == ["started", "segment", "done"]
    assert shell.active_at_done == [0] and not engine.open_streams
    assert shell.finished == ["a"] and host.contexts == []
    assert shell.audio_bytes == len("Hello there.") * engine.samples_per_char * 2


async def test_a_refused_context_sends_one_error_and_its_effects_are_dropped() -> None:
    engine = FakeEngine(slots=0)
    host, shell, state = host_for(engine)
    await host.apply([opening("a"), QueueSegment("a", "Hello."), QueueEnd("a")])
    assert shell.kinds() == ["error"] and shell.messages[0]["code"] == "overloaded"
    assert shell.finished == ["a"] and state.admission.active == 0 and host.contexts == []

    host, shell, state = host_for(FakeEngine(), max_active_contexts=1)
    await host.apply([opening("a"), opening("b"), QueueSegment("b", "Hi."), CancelContext("b")])
    assert shell.kinds() == ["started", "error"] and shell.messages[1]["context"] == "b"
    await host.abandon()
    assert state.admission.active == 0


async def test_shutdown_and_abandon_end_every_context() -> None:
    engine = FakeEngine(chunk_delay_s=0.05)
    host, shell, state = host_for(engine)
    await host.apply([opening("a"), QueueSegment("a", "A long sentence that takes a while.")])
    await host.apply([opening("b"), QueueSegment("b", "Another one, also long enough.")])
    await host.shutdown()
    dones = [m for m in shell.messages if m["type"] == "done"]
    assert sorted(m["context"] for m in dones) == ["a", "b"]
    assert {m["reason"] for m in dones} == {"shutdown"}
    assert state.admission.active == 0 and not engine.open_streams
