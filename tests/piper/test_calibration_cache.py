"""A voice's calibration kept between starts: read back only for the same voice, code,
libraries and CPU; checked on the machine that reads it; replaced where it does not hold."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts.piper import calibration_cache, load
from streamtts.piper.calibration_cache import (
    Calibration,
    CalibrationCache,
    StoredVoice,
    cache_directory,
    calibration_key,
    voice_digest,
)
from streamtts.piper.chain import Link
from streamtts.piper.engine import bundled_voice_paths
from streamtts.piper.load import load_voice
from streamtts.piper.settings import PiperSettings
from streamtts.piper.stages import CALIBRATION_SENTENCES, StagedVoice, Stages, matches

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
    key = calibration_key(voice_digest(model, config), onnx_threads=1, blocked=True)
    assert calibration_key(voice_digest(model, config), onnx_threads=1, blocked=True) == key
    other = tmp_path / "other"
    other.mkdir()
    same_files = voice_files(other)
    assert (
        calibration_key(voice_digest(*same_files), onnx_threads=1, blocked=True) == key
    )  # content, not path
    changed = {
        "model": calibration_key(voice_digest(*voice_files(other, model=b"model2")), 1, True),
        "config": calibration_key(voice_digest(*voice_files(other, config=b'{"a": 1}')), 1, True),
        "threads": calibration_key(voice_digest(model, config), 2, True),
        "blocked": calibration_key(voice_digest(model, config), 1, False),
    }
    monkeypatch.setattr(calibration_cache, "_cpu_identity", lambda: "another CPU")
    changed["cpu"] = calibration_key(voice_digest(model, config), 1, True)
    monkeypatch.undo()
    monkeypatch.setattr(calibration_cache, "_version", lambda library: "0.0.0")
    changed["libraries"] = calibration_key(voice_digest(model, config), 1, True)
    assert len({key, *changed.values()}) == 1 + len(changed), changed


def test_the_key_covers_the_piper_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = voice_files(tmp_path)
    package = tmp_path / "package"
    package.mkdir()
    (package / "stages.py").write_text("# one version\n")
    monkeypatch.setattr(calibration_cache, "_PIPER_PACKAGE_DIR", package)
    before = calibration_key(voice_digest(model, config), 1, True)
    (package / "stages.py").write_text("# another\n")
    assert calibration_key(voice_digest(model, config), 1, True) != before


def test_an_entry_round_trips(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "made" / "on" / "store")
    assert cache.load("k") is None
    cache.store("k", FOUND)
    assert cache.load("k") == StoredVoice(FOUND)
    assert [p.name for p in cache.directory.iterdir()] == ["k.json"]  # no partial file left
    whole_only = dataclasses.replace(FOUND, context_frames=None, flow_context_frames=None)
    cache.store("k", whole_only)
    assert cache.load("k") == StoredVoice(whole_only)


def good_entry() -> dict[str, Any]:
    return {
        "format": 2,
        "voice": None,
        "calibration": dataclasses.asdict(FOUND),
        "layout": None,
        "parts": None,
    }


@pytest.mark.parametrize(
    "spoil",
    [
        lambda e: "not json",
        lambda e: [],
        lambda e: {**e, "format": 1},
        lambda e: {**e, "extra": 1},
        lambda e: {k: v for k, v in e.items() if k != "layout"},
        lambda e: {**e, "calibration": {**e["calibration"], "gain": 0}},
        lambda e: {**e, "calibration": {**e["calibration"], "context_frames": "12"}},
        lambda e: {**e, "calibration": {**e["calibration"], "context_frames": -1}},
        lambda e: {**e, "calibration": {**e["calibration"], "flow_chained": 1}},
        lambda e: {**e, "calibration": {k: v for k, v in e["calibration"].items() if k != "gain"}},
        lambda e: {**e, "layout": {}},  # a layout without its parts' folder
        lambda e: {**e, "layout": {}, "parts": "../k.elsewhere"},  # not beside its entry
        lambda e: {**e, "layout": {}, "parts": "other.abc"},  # another key's parts
    ],
)
def test_an_entry_that_is_not_ours_is_not_used(
    spoil: Callable[[dict[str, Any]], object], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert CalibrationCache(tmp_path).load("k") is None  # nothing stored: nothing said
    spoiled = spoil(good_entry())
    (tmp_path / "k.json").write_text(spoiled if isinstance(spoiled, str) else json.dumps(spoiled))
    with caplog.at_level(logging.WARNING, logger=calibration_cache.__name__):
        assert CalibrationCache(tmp_path).load("k") is None
    assert "not usable" in caplog.text
    (tmp_path / "k.json").write_text(json.dumps(good_entry()))
    assert CalibrationCache(tmp_path).load("k") == StoredVoice(FOUND)


def test_an_entry_with_parts_replaces_the_older_parts(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path)
    layout = {"what": "the loader's own description"}
    cache.store("k", FOUND, layout, {"a.onnx": b"first"})
    first = cache.load("k")
    assert first is not None and first.layout == layout and first.parts_dir is not None
    assert (first.parts_dir / "a.onnx").read_bytes() == b"first"
    cache.store("k", FOUND, layout, {"a.onnx": b"second", "b.onnx": b"more"})
    second = cache.load("k")
    assert second is not None and second.parts_dir is not None
    assert not first.parts_dir.exists()
    assert sorted(p.name for p in second.parts_dir.iterdir()) == ["a.onnx", "b.onnx"]
    assert {p.name for p in tmp_path.iterdir()} == {"k.json", second.parts_dir.name}


def aged(cache: CalibrationCache, key: str, seconds: float) -> None:
    """Mark ``key``'s entry (and its parts) as last used ``seconds`` ago."""
    when = time.time() - seconds
    for path in cache.directory.glob(f"{key}.*"):
        os.utime(path, (when, when))


def test_a_voice_keeps_its_most_recently_used_entries(tmp_path: Path) -> None:
    """A new key per code version, library or CPU: storing one removes the voice's entries
    beyond the three used last (a load counts as a use), with their graphs; another voice's
    entries stay."""
    cache = CalibrationCache(tmp_path)
    for key, age_h in [("v1", 30), ("v2", 20), ("v3", 10), ("amy", 40)]:
        cache.store(key, FOUND, {}, {"a.onnx": b"graph"}, voice="amy" if key == "amy" else "joe")
        aged(cache, key, 3600.0 * age_h)
    assert cache.load("v1") is not None  # v1 used now: kept before v3 and v2
    cache.store("v4", FOUND, {}, {"a.onnx": b"graph"}, voice="joe")
    left = {p.name.split(".")[0] for p in tmp_path.iterdir()}
    assert left == {"v4", "v3", "v1", "amy"}
    for key in left:
        entry = cache.load(key)
        assert entry is not None and entry.parts_dir is not None
        assert (entry.parts_dir / "a.onnx").read_bytes() == b"graph"
    assert sum(p.is_dir() for p in tmp_path.iterdir()) == 4  # no parts without their entry


def test_entries_unused_for_a_month_and_abandoned_parts_are_removed(tmp_path: Path) -> None:
    """Whatever their voice, or if this code cannot read them; parts' folders and partial
    files of no entry once an hour old (younger, they may be another start's being written)."""
    cache = CalibrationCache(tmp_path)
    cache.store("old", FOUND, voice="amy")
    cache.store("recent", FOUND, voice="amy")
    (tmp_path / "legacy.json").write_text('{"format": 1}')
    (tmp_path / "broken.json").write_text("not json")
    for name in ["orphan.abc", "fresh-orphan.abc"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.onnx").write_bytes(b"graph")
    (tmp_path / ".old.partial").write_text("")
    month_s = 30 * 24 * 3600.0
    aged(cache, "old", month_s + 60)
    aged(cache, "recent", month_s - 3600)
    aged(cache, "legacy", month_s + 60)
    aged(cache, "broken", month_s + 60)
    aged(cache, "orphan", 3601)
    old_partial = time.time() - 3601
    os.utime(tmp_path / ".old.partial", (old_partial, old_partial))
    cache.store("new", FOUND, voice="joe")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fresh-orphan.abc",
        "new.json",
        "recent.json",
    ]


def test_removing_what_another_start_removed_first_is_no_error(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path)
    cache.store("old", FOUND, {}, {"a.onnx": b"graph"}, voice="joe")
    aged(cache, "old", 31 * 24 * 3600.0)
    shutil.rmtree(next(p for p in tmp_path.iterdir() if p.is_dir()))
    cache.store("new", FOUND, voice="joe")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json"]


def test_a_folder_that_cannot_be_listed_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=calibration_cache.__name__):
        CalibrationCache(tmp_path / "gone").evict("k", "joe")
    assert "cannot clean" in caplog.text


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


def refused(*args: object, **kwargs: object) -> None:
    raise AssertionError("calibrated, or the graph cut, although it was stored")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StagedVoice]:
    """A cache folder holding the bundled voice as a first load stored it, and that voice."""
    directory = tmp_path_factory.mktemp("calibration")
    model, config = bundled_voice_paths()
    found = load_voice(model, config, onnx_threads=1, cache=CalibrationCache(directory))
    return directory, found


def copied(stored: tuple[Path, StagedVoice], tmp_path: Path) -> CalibrationCache:
    shutil.copytree(stored[0], tmp_path / "cache")
    return CalibrationCache(tmp_path / "cache")


def test_a_first_load_stores_its_calibration_and_its_graphs(
    stored: tuple[Path, StagedVoice], voice: StagedVoice
) -> None:
    """What the first load found is what the shared voice's load (no cache) found; the flow is
    kept as its links and the decoder as rewritten, as the voice runs them."""
    directory, found = stored
    assert found.calibration() == voice.calibration()
    model, config = bundled_voice_paths()
    entry = CalibrationCache(directory).load(calibration_key(voice_digest(model, config), 1, True))
    assert entry is not None and entry.calibration == voice.calibration()
    stored_json = json.loads((directory / f"{entry.parts_dir.name.split('.')[0]}.json").read_text())
    assert stored_json["voice"] == voice_digest(model, config)
    assert entry.parts_dir is not None and entry.layout is not None
    assert len(entry.layout["links"]) == 4 and not entry.layout["flow"]
    assert entry.layout["optimized"] is True  # as ONNX Runtime optimized them
    assert sorted(p.name for p in entry.parts_dir.iterdir()) == [
        "decoder.onnx",
        "front.onnx",
        *(f"link{i}.onnx" for i in range(4)),
    ]


def test_a_load_from_the_cache_neither_cuts_nor_calibrates_and_makes_the_same_audio(
    stored: tuple[Path, StagedVoice], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "calibrate", refused)
    monkeypatch.setattr(load, "split_graph", refused)
    monkeypatch.setattr(StagedVoice, "adopt_decoder", refused)
    model, config = bundled_voice_paths()
    restored = load_voice(model, config, onnx_threads=1, cache=copied(stored, tmp_path))
    assert restored.calibration() == stored[1].calibration()
    assert restored.decodes_blocked and restored.flow_chained
    assert same_audio(stored[1], restored)


def test_a_load_from_the_cache_does_not_optimize_its_graphs_again(
    stored: tuple[Path, StagedVoice], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored graphs are ONNX Runtime's optimized ones: their sessions skip its graph
    optimizations (the same audio: the test above)."""
    import onnxruntime

    levels: list[Any] = []
    made = onnxruntime.InferenceSession

    def recording(source: Any, sess_options: Any = None, **kwargs: Any) -> Any:
        levels.append(sess_options.graph_optimization_level)
        return made(source, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", recording)
    model, config = bundled_voice_paths()
    load_voice(model, config, onnx_threads=1, cache=copied(stored, tmp_path))
    assert levels == [onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL] * 6  # front, 4, decoder


class Graph:
    def __init__(self, name: str) -> None:
        self.name = name

    def SerializeToString(self) -> bytes:  # noqa: N802 - onnx's name
        return f"{self.name} as cut".encode()


@pytest.mark.parametrize("blocked", [True, False])
def test_the_graphs_stored_are_the_optimized_ones_of_the_stages_in_use(
    blocked: bool, tmp_path: Path
) -> None:
    """The decoder in use (the rewritten one where it decodes blocked), the flow's links; all
    as cut where ONNX Runtime kept any of them not."""
    links = tuple(Link(Graph(f"link{i}"), "in", "out", 8) for i in range(2))
    split = Stages(Graph("front"), Graph("flow"), Graph("decoder"), "z", ("m", "l"), False, links)
    names = ["front.onnx", "decoder.onnx", "decoder.blocked.onnx", "link0.onnx", "link1.onnx"]
    for name in names:
        (tmp_path / name).write_bytes(f"{name} optimized".encode())
    layout, parts = load._layout(split, True, blocked, tmp_path)
    decoder = "decoder.blocked.onnx" if blocked else "decoder.onnx"
    assert layout["optimized"] is True and not layout["flow"] and len(layout["links"]) == 2
    assert parts == {
        "front.onnx": b"front.onnx optimized",
        "decoder.onnx": f"{decoder} optimized".encode(),
        "link0.onnx": b"link0.onnx optimized",
        "link1.onnx": b"link1.onnx optimized",
    }
    (tmp_path / "link1.onnx").unlink()
    layout, parts = load._layout(split, True, blocked, tmp_path)
    assert layout["optimized"] is False
    assert parts["link1.onnx"] == b"link1 as cut" and parts["front.onnx"] == b"front as cut"
    layout, parts = load._layout(split, False, blocked, tmp_path)  # the flow whole, as cut
    assert layout["flow"] and layout["links"] == [] and parts["flow.onnx"] == b"flow as cut"
    layout, parts = load._layout(split, True, blocked, None)  # no folder: all as cut
    assert layout["optimized"] is False and parts["front.onnx"] == b"front as cut"


def test_a_graph_that_cannot_be_kept_optimized_still_runs(
    stored: tuple[Path, StagedVoice], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cache is only a shortcut: where the optimized graph cannot be written (here its
    folder is missing; a full disk), the session is made without keeping it."""
    entry = CalibrationCache(stored[0]).load(next(stored[0].glob("*.json")).stem)
    assert entry is not None and entry.parts_dir is not None
    graph = str(entry.parts_dir / "link0.onnx")
    session = load._session_maker(1, optimized_to=tmp_path / "missing")
    with caplog.at_level(logging.WARNING, logger=load.__name__):
        made = session(graph, "link0.onnx")
    assert "could not be kept optimized" in caplog.text
    assert [i.name for i in made.get_inputs()] == [
        i.name for i in load._session_maker(1)(graph, None).get_inputs()
    ]
    assert not (tmp_path / "missing").exists()


def test_a_stored_calibration_without_graphs_cuts_the_graph_again(
    voice: StagedVoice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry of the calibration alone (as stored for a voice that runs whole): the graph is
    cut and rewritten again, without calibrating or checking the rewrite."""
    model, config = bundled_voice_paths()
    cache = CalibrationCache(tmp_path)
    cache.store(calibration_key(voice_digest(model, config), 1, True), voice.calibration())
    monkeypatch.setattr(load, "calibrate", refused)
    monkeypatch.setattr(StagedVoice, "adopt_decoder", refused)
    restored = load_voice(model, config, onnx_threads=1, cache=cache)
    assert restored.calibration() == voice.calibration()
    assert same_audio(voice, restored)


@pytest.mark.parametrize("spoiled", ["context", "graph"])
def test_a_stored_voice_that_does_not_hold_or_load_is_found_again_and_replaced(
    spoiled: str,
    stored: tuple[Path, StagedVoice],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An entry whose decoder context is too short for this voice (windows then differ from
    the sentence made whole), or whose decoder's file is cut short: the load calibrates as if
    nothing were stored, and stores what it finds in its place."""
    model, config = bundled_voice_paths()
    cache = copied(stored, tmp_path)
    key = calibration_key(voice_digest(model, config), 1, True)
    entry = cache.load(key)
    assert entry is not None and entry.parts_dir is not None
    if spoiled == "context":
        assert entry.calibration.context_frames is not None
        data = json.loads((cache.directory / f"{key}.json").read_text())
        data["calibration"]["context_frames"] = 2
        (cache.directory / f"{key}.json").write_text(json.dumps(data))
    else:
        decoder = entry.parts_dir / "decoder.onnx"
        decoder.write_bytes(decoder.read_bytes()[:1000])
    with caplog.at_level(logging.WARNING, logger=load.__name__):
        loaded = load_voice(model, config, onnx_threads=1, cache=cache)
    assert "does not hold" in caplog.text
    assert loaded.calibration() == stored[1].calibration()
    replaced = cache.load(key)
    assert replaced is not None and replaced.calibration == stored[1].calibration()
    assert replaced.parts_dir != entry.parts_dir and not entry.parts_dir.exists()
    assert same_audio(stored[1], loaded)
