"""The voice catalog: what each engine offers, uploads refused with the documented codes,
codecs kept apart, and replicas that share a folder seeing each other's voices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtts.engine.base import ClonedVoice, UnknownVoiceError
from streamtts.options import FISH
from streamtts.voices.catalog import VoiceCatalog, VoiceError, VoiceUpload
from streamtts.voices.settings import VoiceSettings
from tests.audio_files import encode, tone
from tests.fake_engine import VOICE, FakeEngine

REFERENCE = encode(tone(3.0), 22_050, "wav")


def catalog(folder: Path, engine: FakeEngine | None = None, **settings: object) -> VoiceCatalog:
    engine = engine or FakeEngine(FISH, clones=True)
    return VoiceCatalog(engine, VoiceSettings(voices_dir=str(folder), **settings))  # type: ignore[arg-type]


def upload(**fields: object) -> VoiceUpload:
    base: dict[str, object] = {"audio": REFERENCE, "filename": "me.wav", "text": "Hello there."}
    return VoiceUpload(**{**base, **fields})  # type: ignore[arg-type]


async def test_a_voice_is_created_listed_resolved_and_deleted(tmp_path: Path) -> None:
    engine = FakeEngine(FISH, clones=True)
    voices = catalog(tmp_path, engine)
    created = await voices.create(upload(name="Anna Smith"))
    assert created["id"].startswith("anna-smith-") and created["cloned"] is True
    assert created["duration_s"] == pytest.approx(3.0, abs=0.01) and created["frames"] == 64
    assert created["id"] in voices and "default" in voices and VOICE in voices
    resolved = voices.resolve(created["id"])
    assert isinstance(resolved, ClonedVoice) and resolved.codes.shape == (8, 64)
    assert voices.resolve("default") == VOICE
    assert [v["cloned"] for v in voices.listing()] == [False, True]
    await voices.delete(created["id"])
    assert created["id"] not in voices and engine.forgotten == [created["id"]]
    with pytest.raises(UnknownVoiceError):
        voices.resolve(created["id"])


@pytest.mark.parametrize(
    ("fields", "code", "status"),
    [
        ({"audio": b""}, "missing_audio", 400),
        ({"text": "   "}, "missing_text", 400),
        ({"audio": b"definitely not audio" * 50}, "unsupported_audio", 415),
        ({"audio": encode(tone(1.0), 22_050, "wav")}, "audio_too_short", 400),
        ({"audio": encode(tone(31.0), 22_050, "flac")}, "audio_too_long", 400),
        ({"voice_id": "Bad Id"}, "invalid_voice_id", 400),
        ({"voice_id": "default"}, "reserved_voice_id", 400),
        ({"voice_id": VOICE}, "reserved_voice_id", 400),
    ],
)
async def test_bad_uploads_are_refused_and_change_nothing(
    tmp_path: Path, fields: dict[str, object], code: str, status: int
) -> None:
    voices = catalog(tmp_path)
    with pytest.raises(VoiceError) as info:
        await voices.create(upload(**fields))
    assert (info.value.code, info.value.status) == (code, status)
    assert [v for v in voices.listing() if v["cloned"]] == []
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


async def test_ids_are_unique_and_the_library_is_bounded(tmp_path: Path) -> None:
    voices = catalog(tmp_path, max_voices=2)
    await voices.create(upload(voice_id="one"))
    with pytest.raises(VoiceError) as exists:
        await voices.create(upload(voice_id="one"))
    assert exists.value.code == "voice_exists" and exists.value.status == 409
    await voices.create(upload(voice_id="two"))
    with pytest.raises(VoiceError) as full:
        await voices.create(upload(voice_id="three"))
    assert full.value.code == "too_many_voices"


async def test_an_engine_that_cannot_clone_refuses(tmp_path: Path) -> None:
    voices = catalog(tmp_path, FakeEngine())
    with pytest.raises(VoiceError) as info:
        await voices.create(upload())
    assert info.value.code == "cloning_not_supported"
    with pytest.raises(VoiceError) as builtin:
        await voices.delete(VOICE)
    assert builtin.value.code == "builtin_voice"
    with pytest.raises(VoiceError) as missing:
        await voices.delete("nobody")
    assert missing.value.status == 404


async def test_replicas_sharing_a_folder_see_each_others_voices(tmp_path: Path) -> None:
    one, two = catalog(tmp_path), catalog(tmp_path)
    created = await one.create(upload(voice_id="shared"))
    assert "shared" not in two  # not yet rescanned
    await two.refresh_on_miss("shared")
    assert "shared" in two and two.get("shared") == created
    await one.delete("shared")
    await two.refresh()
    assert "shared" not in two


async def test_a_voice_of_another_codec_is_not_offered(tmp_path: Path) -> None:
    await catalog(tmp_path, FakeEngine(FISH, clones=True, codec="codec-a")).create(
        upload(voice_id="made-by-a")
    )
    other = catalog(tmp_path, FakeEngine(FISH, clones=True, codec="codec-b"))
    await other.refresh()
    assert "made-by-a" not in other


async def test_a_restart_keeps_the_voices(tmp_path: Path) -> None:
    await catalog(tmp_path).create(upload(voice_id="kept", text="Some words here."))
    restarted = catalog(tmp_path)
    await restarted.refresh()
    voice = restarted.resolve("kept")
    assert isinstance(voice, ClonedVoice) and voice.text == "Some words here."
    assert np.asarray(voice.codes).dtype == np.int32


async def test_infos_list_stored_voices_after_the_engines_own(tmp_path: Path) -> None:
    """What Wyoming's describe lists: every voice a request may name."""
    voices = catalog(tmp_path)
    created = await voices.create(upload(name="Anna"))
    infos = voices.infos()
    assert [i.id for i in infos] == [VOICE, created["id"]]
    assert infos[1].language == "multi" and infos[1].name == "Anna"
    assert "cloned from 3.0 s" in infos[1].description


async def test_a_one_off_voice_is_encoded_not_stored(tmp_path: Path) -> None:
    voices = catalog(tmp_path)
    voice = await voices.one_off(REFERENCE, "  Hello   there. ")
    assert voice.text == "Hello there." and voice.codes.shape == (8, 64)
    assert [v["cloned"] for v in voices.listing()] == [False]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(VoiceError) as refused:
        await voices.one_off(encode(tone(1.0), 22_050, "wav"), "Hi.")
    assert refused.value.code == "audio_too_short"
    piper = catalog(tmp_path, FakeEngine())
    with pytest.raises(VoiceError) as cannot:
        await piper.one_off(REFERENCE, "Hi.")
    assert cannot.value.code == "cloning_not_supported"
