"""A streamed HTTP response body of synthesised audio, shared by the speech routes (OpenAI
``/v1/audio/speech``, Fish ``/v1/tts``): the text cut into segments, each spoken by the engine
stream, resampled (soxr) and encoded into the response format as it comes.

The body holds its admission ticket and engine stream until it ends: on completion, on an engine
error, when the client disconnects mid-body (the generator is closed) and when the shutdown
grace is over (the body stops there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from streamtts.audio import StreamingResampler, make_container_encoder
from streamtts.engine.base import EngineError, EngineStream
from streamtts.segmenter import segment_text
from streamtts.server.admission import Ticket
from streamtts.server.errors import wire_error
from streamtts.server.state import AppState


async def encoded_audio(
    stream: EngineStream,
    ticket: Ticket,
    state: AppState,
    text: str,
    fmt: str,
    rate_hz: int,
    bit_rate_bps: int | None = None,
) -> AsyncIterator[bytes]:
    settings = state.settings
    expired = state.lifecycle.expired
    reason = "disconnect"
    segments = segment_text(text, settings.segmenter)
    resampler = StreamingResampler(stream.sample_rate, rate_hz)
    encoder = make_container_encoder(fmt, rate_hz, bit_rate_bps)
    try:
        for text_segment in segments:
            async for pcm in stream.synthesize(text_segment):
                if expired.is_set():  # shutdown grace is over: end the body here
                    reason = "shutdown"
                    return
                out = encoder.write(resampler.process(pcm))
                if out:
                    yield out
        tail = encoder.write(resampler.flush()) + encoder.finish()
        if tail:
            yield tail
        reason = "end"
    except EngineError as exc:
        reason = "error"
        state.metrics.errors_total.labels(wire_error(exc).code).inc()
        raise
    finally:
        # Runs on completion and when the client disconnects mid-body (generator closed).
        encoder.close()
        stream.close()
        ticket.release()
        state.metrics.contexts_total.labels(reason).inc()
