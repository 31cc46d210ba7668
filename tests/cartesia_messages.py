"""What the real Cartesia clients send on ``/tts/websocket`` (client-wire-facts.md §6), for the
dialect's unit tests and the socket tests alike."""

from __future__ import annotations

from typing import Any

F32_44K = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 44100}
S16_24K = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}


def sdk_push(context: str, transcript: str, more: bool = True, **extra: Any) -> dict[str, Any]:
    """What ``WebSocketContext.push``/``no_more_inputs`` send (cartesia 4.2.0)."""
    return {
        "context_id": context,
        "model_id": "sonic-latest",
        "transcript": transcript,
        "voice": "default",
        "output_format": F32_44K,
        "continue": more,
        **extra,
    }


def pipecat(context: str, transcript: str, more: bool = True) -> dict[str, Any]:
    """What Pipecat's ``CartesiaTTSService`` sends (pipecat-ai 1.14.0)."""
    return {
        "transcript": transcript,
        "continue": more,
        "context_id": context,
        "model_id": "sonic-3.6",
        "voice": {"mode": "id", "id": "default"},
        "output_format": S16_24K,
        "add_timestamps": True,
        "use_normalized_timestamps": False,
        "max_buffer_delay_ms": 0,
        "language": "en",
    }
