"""The one table of synthesis options: what a client may ask of one stream's audio.

Every option is declared here once — name, type, range, default, and the engines that honour
it — and every interface (the native protocol's ``start.options``, the OpenAI route's
``speed``, and the compatibility protocols) validates against this table. Two rules:

- An option an engine cannot honour is **refused** when the stream starts (``invalid_field``,
  naming the option); it is never accepted and ignored.
- A value **equal to the option's default** asks for nothing, so it is accepted by every
  engine (clients such as the Fish SDK always send ``top_p``, ``temperature``...). Parsing
  turns such a value into "unset" (``None``).

Fields that change nothing about the audio (a model name, a latency hint, logging flags) are
not options; :data:`TRANSPORT_FIELDS` lists them per interface, and the docs repeat the list.
Pure Python: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

FISH = "fish"
PIPER = "piper"
ENGINE_KINDS = (FISH, PIPER)


class OptionError(ValueError):
    """An option is unknown, of the wrong type, out of range, or not honoured by the engine."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.message = message


@dataclass(frozen=True)
class Option:
    name: str
    kind: type[float] | type[int]
    minimum: float
    maximum: float
    default: float | int | None  # None: no default value (seed) or the engine's setting
    engines: frozenset[str]
    doc: str
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False

    def range_text(self) -> str:
        low = "<" if self.exclusive_minimum else "≤"
        high = "<" if self.exclusive_maximum else "≤"
        return f"{_number(self.minimum)} {low} {self.name} {high} {_number(self.maximum)}"

    def check(self, value: object) -> float | int:
        """``value`` as this option's type, or :class:`OptionError`."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OptionError(self.name, f"option {self.name!r} must be a number")
        if self.kind is int and not isinstance(value, int):
            raise OptionError(self.name, f"option {self.name!r} must be an integer")
        if not math.isfinite(value):
            raise OptionError(self.name, f"option {self.name!r} must be a finite number")
        low_ok = value > self.minimum if self.exclusive_minimum else value >= self.minimum
        high_ok = value < self.maximum if self.exclusive_maximum else value <= self.maximum
        if not (low_ok and high_ok):
            raise OptionError(self.name, f"option {self.name!r} must satisfy {self.range_text()}")
        return int(value) if self.kind is int else float(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_BOTH = frozenset(ENGINE_KINDS)
_FISH = frozenset({FISH})

# Fish-Speech's sampling defaults are upstream's API defaults (spec §4.1); its ranges are the
# generic bounds upstream asserts (0 < top_p ≤ 1, 0 < repetition_penalty < 2, 0 < temperature < 2).
OPTIONS: tuple[Option, ...] = (
    Option(
        "speed",
        float,
        0.25,
        4.0,
        1.0,
        frozenset({PIPER}),
        "speaking rate (1 = natural). Piper changes its phoneme durations; Fish-Speech has no "
        "such control and refuses any other value",
    ),
    Option(
        "temperature",
        float,
        0.0,
        2.0,
        0.7,
        _FISH,
        "sampling temperature of the semantic tokens",
        exclusive_minimum=True,
        exclusive_maximum=True,
    ),
    Option(
        "top_p",
        float,
        0.0,
        1.0,
        0.7,
        _FISH,
        "nucleus sampling mass (computed before the temperature, as upstream)",
        exclusive_minimum=True,
    ),
    Option(
        "repetition_penalty",
        float,
        0.0,
        2.0,
        1.2,
        _FISH,
        "penalty on tokens of the last 16 frames",
        exclusive_minimum=True,
        exclusive_maximum=True,
    ),
    Option(
        "seed",
        int,
        0,
        2**63 - 1,
        None,
        _FISH,
        "random seed of the stream's sampling: the same seed, text and options give the same "
        "audio (docs/protocol.md says when)",
    ),
    Option(
        "first_chunk_frames",
        int,
        1,
        256,
        None,
        _FISH,
        "frames generated before a segment's first audio (default: the server's setting)",
    ),
    Option(
        "chunk_frames",
        int,
        1,
        256,
        None,
        _FISH,
        "the most frames per later audio chunk; they ramp up to it from the first chunk's "
        "size (default: the server's setting)",
    ),
    Option(
        "max_frames_per_segment",
        int,
        1,
        8192,
        None,
        _FISH,
        "upper bound on the frames of one text segment (default: the server's setting)",
    ),
)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}

# Request fields that are not options: they change nothing about the audio. Per interface,
# field -> what it is; documented in docs/protocol.md.
TRANSPORT_FIELDS: dict[str, dict[str, str]] = {
    "openai": {
        "model": "any model name is accepted; the server's one model speaks",
        "stream_format": "'audio' (a streamed body) or 'sse' (server-sent events)",
        "stream": "accepted as true (the body always streams), as other OpenAI-style servers",
    },
    # ElevenLabs stream-input / multi-stream-input: query parameters and message fields.
    "elevenlabs": {
        "model_id": "any model name is accepted; the server's one model speaks",
        "language_code": "the voice speaks its own language",
        "enable_logging": "true or false; the server logs no text either way",
        "sync_alignment": "true or false; alignment is never sent (no engine has real "
        "character timings)",
        "optimize_streaming_latency": "a latency hint; the server always streams as soon as it can",
        "try_trigger_generation": "a legacy latency hint; speech starts at the first sentence "
        "or clause end",
        "generation_config.chunk_length_schedule": "checked as the vendor defines it (50 to "
        "500 per item); a buffering hint that the server's sentence segmentation replaces",
        "xi-api-key, authorization (in a message)": "keys are read from the handshake only",
    },
    # Cartesia /tts/websocket: generation request fields.
    "cartesia": {
        "model_id": "any model name is accepted; the server's one model speaks",
        "language": "the voice speaks its own language",
        "add_timestamps": "true or false; timestamps are never sent (no engine has real word "
        "timings)",
        "add_phoneme_timestamps": "true or false; phoneme timestamps are never sent",
        "use_normalized_timestamps": "true or false (no timestamps are sent)",
    },
    "wyoming": {
        "context": "the pipeline's context for its next interaction; not part of the speech",
    },
    "fish": {
        "chunk_length": "upstream's characters per text chunk (100..1000); streamtts cuts text "
        "at sentences (max_segment_chars) whatever its value",
        "min_chunk_length": "the cloud's smallest text chunk; as chunk_length",
        "normalize": "upstream v1.5.0's Chinese text normaliser, which v1.5.1 removed from its "
        "server path; streamtts, like 1.5.1, normalises no text: true and false speak the same",
        "latency": "'normal' or 'balanced'; streamtts always streams at its lowest latency",
        "streaming": "upstream's switch for a streamed body; the body always streams",
        "use_memory_cache": "upstream's cache of encoded references ('on'/'off')",
    },
}


@dataclass(frozen=True)
class SynthesisOptions:
    """One stream's options; ``None`` means unset (the engine's default or setting)."""

    speed: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    first_chunk_frames: int | None = None
    chunk_frames: int | None = None
    max_frames_per_segment: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                BY_NAME[f.name].check(value)

    def set_options(self) -> dict[str, float | int]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def parse_options(raw: Mapping[str, Any]) -> SynthesisOptions:
    """Validate client options by the table; values equal to their default become unset.

    Raises :class:`OptionError` for an unknown name, a wrong type or a value out of range.
    """
    values: dict[str, float | int] = {}
    for name, value in raw.items():
        option = BY_NAME.get(name)
        if option is None:
            known = ", ".join(BY_NAME)
            raise OptionError(name, f"unknown option {name!r}; the options are {known}")
        if value is None:
            continue  # unset, as clients that send every field with null (Fish's live start)
        checked = option.check(value)
        if option.default is None or checked != option.default:
            values[name] = checked
    return SynthesisOptions(**values)  # type: ignore[arg-type]


def refuse_unhonoured(options: SynthesisOptions, engine_kind: str) -> None:
    """Raise :class:`OptionError` for the first set option that ``engine_kind`` cannot honour."""
    for name in options.set_options():
        option = BY_NAME[name]
        if engine_kind not in option.engines:
            honoured = ", ".join(sorted(option.engines))
            raise OptionError(
                name,
                f"option {name!r} is not supported by the {engine_kind} engine "
                f"(only {honoured}); leave it unset or at its default",
            )


def describe_options(engine_kind: str) -> list[dict[str, Any]]:
    """The options ``engine_kind`` takes, for ``GET /v1/models``."""
    return [
        {
            "name": o.name,
            "type": o.kind.__name__,
            "range": o.range_text(),
            "default": o.default,
            "description": o.doc,
        }
        for o in OPTIONS
        if engine_kind in o.engines
    ]
