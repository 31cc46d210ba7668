"""Hypothesis strategies shared by the protocol tests and the live fuzzers."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_values(allow_nan: bool = True) -> st.SearchStrategy[Any]:
    """Any JSON-shaped value (NaN and infinities too unless ``allow_nan`` is off: a JSON
    encoder then writes them as non-standard tokens, which a server must refuse cleanly)."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=allow_nan, allow_infinity=allow_nan)
        | st.text(max_size=30)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


JSON_VALUES = json_values()
OPTION_NAMES = st.sampled_from(
    ["speed", "temperature", "top_p", "repetition_penalty", "seed", "chunk_frames", "warp"]
)


def near_native_messages(
    contexts: st.SearchStrategy[str], voices: st.SearchStrategy[str]
) -> st.SearchStrategy[dict[str, Any]]:
    """Native-protocol messages that look almost right: the known fields with random values,
    often of the wrong type."""
    return st.fixed_dictionaries(
        {
            "type": st.sampled_from(["start", "text", "flush", "end", "cancel", "dance", "START"])
            | JSON_VALUES
        },
        optional={
            "context": contexts | JSON_VALUES,
            "text": st.text(max_size=150) | JSON_VALUES,
            "voice": voices | JSON_VALUES,
            "format": st.fixed_dictionaries(
                {},
                optional={
                    "encoding": st.sampled_from(["pcm_s16le", "mulaw", "opus"]) | JSON_VALUES,
                    "sample_rate": st.integers(-10, 100_000) | JSON_VALUES,
                },
            )
            | JSON_VALUES,
            "options": st.dictionaries(OPTION_NAMES | st.text(max_size=8), JSON_VALUES, max_size=3)
            | st.fixed_dictionaries(
                {},
                optional={
                    "speed": st.floats(allow_nan=True) | JSON_VALUES,
                    "seed": st.integers() | JSON_VALUES,
                    "chunk_frames": st.integers(-5, 300),
                },
            ),
        },
    )


def near_elevenlabs_messages(contexts: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    """ElevenLabs (multi-)stream-input messages that look almost right."""
    flag = st.booleans() | JSON_VALUES
    return st.fixed_dictionaries(
        {},
        optional={
            "text": st.sampled_from(["", " ", "Hello there. ", "x" * 600])
            | st.text(max_size=80)
            | JSON_VALUES,
            "context_id": contexts | JSON_VALUES,
            "flush": flag,
            "close_context": flag,
            "close_socket": st.just(False) | JSON_VALUES,
            "try_trigger_generation": flag,
            "voice_settings": st.fixed_dictionaries(
                {},
                optional={
                    "speed": st.floats(0.5, 1.5) | JSON_VALUES,
                    "stability": st.sampled_from([0.5, 0.9]) | JSON_VALUES,
                },
            )
            | JSON_VALUES,
            "generation_config": st.fixed_dictionaries(
                {}, optional={"chunk_length_schedule": st.lists(st.integers(0, 600), max_size=3)}
            )
            | JSON_VALUES,
        },
    )


def near_cartesia_messages(contexts: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Cartesia generation and cancel requests that look almost right."""
    output_format = st.fixed_dictionaries(
        {},
        optional={
            "container": st.sampled_from(["raw", "wav"]) | JSON_VALUES,
            "encoding": st.sampled_from(["pcm_s16le", "pcm_f32le", "pcm_mulaw", "mp3"])
            | JSON_VALUES,
            "sample_rate": st.sampled_from([8000, 24000, 44100, 12345]) | JSON_VALUES,
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "context_id": contexts | JSON_VALUES,
            "transcript": st.sampled_from(["", "Hello there. ", "x" * 600])
            | st.text(max_size=80)
            | JSON_VALUES,
            "continue": st.booleans() | JSON_VALUES,
            "flush": st.booleans() | JSON_VALUES,
            "cancel": st.booleans() | JSON_VALUES,
            "voice": st.sampled_from(["default", "nobody"])
            | st.fixed_dictionaries({"mode": st.sampled_from(["id", "embedding"]), "id": st.text()})
            | JSON_VALUES,
            "output_format": output_format | JSON_VALUES,
            "model_id": st.just("sonic-3") | JSON_VALUES,
            "max_buffer_delay_ms": st.integers(-10, 6000) | JSON_VALUES,
            "generation_config": st.fixed_dictionaries(
                {}, optional={"speed": JSON_VALUES, "volume": JSON_VALUES}
            )
            | JSON_VALUES,
            "speed": st.sampled_from(["normal", "fast"]) | JSON_VALUES,
        },
    )
