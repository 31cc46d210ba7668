"""The voice folder: atomic saves, one winner per id, damaged entries skipped, deletes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from streamtts.voices.store import (
    INCOMING_PREFIX,
    StoredVoice,
    VoiceExistsError,
    VoiceNotFoundError,
    VoiceStore,
)


def voice(voice_id: str, frames: int = 40) -> StoredVoice:
    codes = np.arange(8 * frames, dtype=np.int32).reshape(8, frames) % 1000
    return StoredVoice(
        voice_id, "A voice", "fish", "synthetic:tiny", "codec-1", "Hello there.", 1.9,
        "2026-12-01T09:00:00+00:00", "", codes,
    )  # fmt: skip


def test_a_saved_voice_reads_back_with_its_reference(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    saved = store.save(voice("anna"), b"RIFF...", "wav")
    assert saved.reference_file == "reference.wav"
    assert (tmp_path / "voices" / "anna" / "reference.wav").read_bytes() == b"RIFF..."
    again = VoiceStore(tmp_path / "voices").scan()["anna"]  # a fresh process sees it
    np.testing.assert_array_equal(again.codes, voice("anna").codes)
    assert again.text == "Hello there." and again.codec_id == "codec-1"
    assert not [p for p in (tmp_path / "voices").iterdir() if p.name.startswith(".")]


def test_two_uploads_of_one_id_cannot_both_win(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    results: list[str] = []

    def upload(i: int) -> None:
        try:
            VoiceStore(tmp_path).save(voice("same", frames=10 + i), b"x" * (1000 * i), "wav")
            results.append("saved")
        except VoiceExistsError:
            results.append("exists")

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["exists"] * 5 + ["saved"]
    (only,) = store.scan().values()
    assert only.codes.shape[1] in range(10, 16)  # one whole voice, not a mix
    reference = (tmp_path / "same" / "reference.wav").read_bytes()
    assert len(reference) == 1000 * (only.codes.shape[1] - 10)


def test_damaged_voices_are_skipped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = VoiceStore(tmp_path)
    store.save(voice("good"), b"", "wav")
    for name, meta, codes in (
        ("no-meta", None, True),
        ("bad-json", "{not json", True),
        ("no-codes", json.dumps({"id": "no-codes"}), False),
        ("wrong-id", None, True),
    ):
        folder = tmp_path / name
        folder.mkdir()
        if codes:
            np.save(folder / "codes.npy", np.zeros((8, 3), np.int32))
        if meta is not None:
            (folder / "voice.json").write_text(meta)
    (tmp_path / "wrong-id" / "voice.json").write_text(
        (tmp_path / "good" / "voice.json").read_text()
    )
    (tmp_path / "not a voice!").mkdir()
    assert list(store.scan()) == ["good"]
    assert list(store.scan()) == ["good"]
    skipped = [r for r in caplog.records if "damaged voice" in r.message]
    assert sorted(r.args[0] for r in skipped) == ["bad-json", "no-codes", "no-meta", "wrong-id"]  # type: ignore[index]


def test_an_unfinished_upload_is_debris_not_a_voice(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    half = tmp_path / f"{INCOMING_PREFIX}crashed"
    half.mkdir()
    (half / "voice.json").write_text("{}")
    assert store.scan() == {}


def test_delete(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.save(voice("gone"), b"", "wav")
    store.delete("gone")
    assert store.scan() == {} and not (tmp_path / "gone").exists()
    with pytest.raises(VoiceNotFoundError):
        store.delete("gone")
    with pytest.raises(VoiceNotFoundError):
        store.delete("../etc")
