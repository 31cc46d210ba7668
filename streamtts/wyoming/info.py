"""The answer to ``describe``: one TTS program with every voice of the engine. Pure: built from
``engine.voices()`` (no synthesis), so Home Assistant's one-second ``describe`` is answered at
once, and voices stored later appear at the next ``describe``.

Home Assistant (``homeassistant/components/wyoming``) takes the first program with
``installed: true``, lists only voices with ``installed: true``, offers each voice under its
``languages`` and shows ``description`` (else ``name``); it sends the voice's ``name`` back as
``synthesize.voice.name``.
"""

from __future__ import annotations

from collections.abc import Sequence

from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

from streamtts import __version__
from streamtts.engine.base import VoiceInfo
from streamtts.options import FISH, PIPER

PROGRAM_NAME = "streamtts"
PROGRAM_DESCRIPTION = "streamtts: real-time streaming text-to-speech"
# A voice whose language is "multi" (the Fish-Speech voices) speaks every language the model was
# trained on; Home Assistant needs them listed. Fish-Speech 1.5's eight (its model card).
MULTILINGUAL = "multi"
MULTILINGUAL_LANGUAGES = ("en", "zh", "ja", "ko", "fr", "de", "ar", "es")
_ENGINE_ATTRIBUTION = {
    PIPER: Attribution(name="Piper", url="https://github.com/OHF-Voice/piper1-gpl"),
    FISH: Attribution(name="Fish Audio", url="https://github.com/fishaudio/fish-speech"),
}


def describe_info(voices: Sequence[VoiceInfo]) -> Info:
    return Info(
        tts=[
            TtsProgram(
                name=PROGRAM_NAME,
                attribution=Attribution(name="streamtts", url=""),
                installed=True,
                description=PROGRAM_DESCRIPTION,
                version=__version__,
                voices=[_voice(v) for v in voices],
                supports_synthesize_streaming=True,
            )
        ]
    )


def voice_languages(voice: VoiceInfo) -> list[str]:
    if voice.language == MULTILINGUAL:
        return list(MULTILINGUAL_LANGUAGES)
    return [voice.language]


def _voice(voice: VoiceInfo) -> TtsVoice:
    return TtsVoice(
        name=voice.id,
        attribution=_ENGINE_ATTRIBUTION.get(voice.engine, Attribution(name=voice.engine, url="")),
        installed=True,
        description=voice.name,
        version=None,
        languages=voice_languages(voice),
    )
