"""A voice's calibration kept between starts: read back only for the same voice, code,
libraries and CPU; checked on the machine that reads it; replaced where it does not hold."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest

from streamtts.piper import calibration_cache, stages
from streamtts.piper.calibration_cache import (
    Calibration,
    CalibrationCache,
    cache_directory,
    calibration_key,
)
from streamtts.piper.engine import bundled_voice_paths
from streamtts.piper.settings import PiperSettings
from streamtts.piper.stages import CALIBRATION_SENTENCES, StagedVoice, load_voice, matches

FOUND = Calibration(
    context_frames=12, flow_context_frames=32, flow_chained=True, decodes_blocked=True, gain=1.25
)


def voice_files(
    directory: Path, model: bytes = b"model", config: bytes = b"{}"
) -> tuple[Path, Path]:
    (directory / "v.onnx").write_bytes(model)
    (directory / "v.onnx.json").write_bytes(config)
    return directory / "v.onnx", directory / "v.onnx.json"


def test_the_key_changes_with_everything_calibration_depends_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, config = voice_files(tmp_path)
    key = calibration_key(model, config, onnx_threads=1, blocked=True)
    assert calibration_key(model, config, onnx_threads=1, blocked=True) == key
    other = tmp_path / "other"
    other.mkdir()
    same_files = voice_files(other)
    assert calibration_key(*same_files, onnx_threads=1, blocked=True) == key  # content, not path
    changed = {
        "model": calibration_key(*voice_files(other, model=b"model2"), 1, True),
        "config": calibration_key(*voice_files(other, config=b'{"a": 1}'), 1, True),
        "threads": calibration_key(model, config, 2, True),
        "blocked": calibration_key(model, config, 1, False),
    }
    monkeypatch.setattr(calibration_cache, "_cpu_identity", lambda: "another CPU")
    changed["cpu"] = calibration_key(model, config, 1, True)
    monkeypatch.undo()
    monkeypatch.setattr(calibration_cache, "_version", lambda library: "0.0.0")
    changed["libraries"] = calibration_key(model, config, 1, True)
    assert len({key, *changed.values()}) == 1 + len(changed), changed


def test_the_key_covers_the_piper_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = voice_files(tmp_path)
    package = tmp_path / "package"
    package.mkdir()
    (package / "stages.py").write_text("# one version\n")
    monkeypatch.setattr(calibration_cache, "_PIPER_PACKAGE_DIR", package)
    before = calibration_key(model, config, 1, True)
    (package / "stages.py").write_text("# another\n")
    assert calibration_key(model, config, 1, True) != before


def test_an_entry_round_trips(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "made" / "on" / "store")
    assert cache.load("k") is None
    cache.store("k", FOUND)
    assert cache.load("k") == FOUND
    assert [p.name for p in cache.directory.iterdir()] == ["k.json"]  # no partial file left
    whole_only = dataclasses.replace(FOUND, context_frames=None, flow_context_frames=None)
    cache.store("k", whole_only)
    assert cache.load("k") == whole_only


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": 2, "context_frames": 12, "flow_context_frames": 32, "flow_chained": true,'
        ' "decodes_blocked": true, "gain": 1.0}',
        '{"format": 1, "context_frames": 12, "flow_context_frames": 32, "flow_chained": true,'
        ' "decodes_blocked": true}',
        '{"format": 1, "context_frames": "12", "flow_context_frames": 32, "flow_chained": true,'
        ' "decodes_blocked": true, "gain": 1.0}',
        '{"format": 1, "context_frames": -1, "flow_context_frames": 32, "flow_chained": true,'
        ' "decodes_blocked": true, "gain": 1.0}',
        '{"format": 1, "context_frames": 12, "flow_context_frames": 32, "flow_chained": 1,'
        ' "decodes_blocked": true, "gain": 1.0}',
        '{"format": 1, "context_frames": 12, "flow_context_frames": 32, "flow_chained": true,'
        ' "decodes_blocked": true, "gain": 0}',
        '{"format": 1, "context_frames": 12, "flow_context_frames": 32, "flow_chained": true,'
        ' "decodes_blocked": true, "gain": 1.0, "extra": 1}',
    ],
)
def test_an_entry_that_is_not_ours_is_not_used(
    text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "k.json").write_text(text)
    with caplog.at_level(logging.WARNING, logger=calibration_cache.__name__):
        assert CalibrationCache(tmp_path).load("k") is None
    assert "not usable" in caplog.text


def test_a_folder_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = CalibrationCache(blocker / "cache")  # a folder under a file: cannot be made
    with caplog.at_level(logging.WARNING, logger=calibration_cache.__name__):
        cache.store("k", FOUND)
    assert "cannot write" in caplog.text
    assert cache.load("k") is None


def test_the_setting_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_directory("") == tmp_path / "streamtts" / "piper"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_directory("") == tmp_path / "home" / ".cache" / "streamtts" / "piper"
    assert cache_directory("~/calibrations") == tmp_path / "home" / "calibrations"
    assert cache_directory("off") is None
    assert PiperSettings(piper_calibration_cache="off").calibration_cache() is None
    cache = PiperSettings(piper_calibration_cache=str(tmp_path)).calibration_cache()
    assert cache is not None and cache.directory == tmp_path


def same_audio(a: StagedVoice, b: StagedVoice) -> bool:
    """One sentence's latent frames (drawn by ``a``) decoded by both voices, whole and as a
    first window and the rest."""
    (ids,) = a.phoneme_ids(CALIBRATION_SENTENCES[1])
    sentence = a.sentence(ids, a.scales(1.0))
    made_by_a, made_by_b = a.render(sentence), b.render(sentence)
    head = a.frames(sentence) // 3
    windows = np.concatenate([b.render(sentence, 0, head), b.render(sentence, head)])
    return matches(made_by_b, made_by_a) and matches(windows, made_by_a)


def test_a_load_with_a_stored_calibration_skips_calibrating_and_makes_the_same_audio(
    voice: StagedVoice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared voice's calibration (found by calibrating) stored under the bundled voice's
    key: a load reads it instead of calibrating or checking the blocked decoder again."""
    model, config = bundled_voice_paths()
    cache = CalibrationCache(tmp_path)
    cache.store(calibration_key(model, config, 1, True), voice.calibration())

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("calibrated although a calibration was stored")

    monkeypatch.setattr(stages, "calibrate", refused)
    monkeypatch.setattr(StagedVoice, "adopt_decoder", refused)
    restored = load_voice(model, config, onnx_threads=1, cache=cache)
    assert restored.calibration() == voice.calibration()
    assert restored.decodes_blocked and restored.flow_chained
    assert same_audio(voice, restored)


def test_a_stored_calibration_that_does_not_hold_is_found_again_and_replaced(
    voice: StagedVoice, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry whose decoder context is too short for this voice (windows then differ from
    the sentence made whole): the load calibrates as if nothing were stored, and stores what
    it finds."""
    model, config = bundled_voice_paths()
    cache = CalibrationCache(tmp_path)
    key = calibration_key(model, config, 1, True)
    assert voice.context_frames is not None and voice.context_frames > 2
    cache.store(key, dataclasses.replace(voice.calibration(), context_frames=2))
    with caplog.at_level(logging.WARNING, logger=stages.__name__):
        loaded = load_voice(model, config, onnx_threads=1, cache=cache)
    assert "does not hold" in caplog.text
    assert loaded.calibration() == voice.calibration()
    assert cache.load(key) == voice.calibration()
    assert same_audio(voice, loaded)
