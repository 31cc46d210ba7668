"""A Piper voice from its files: its graph cut into stages (:mod:`stages`), its decoder on
blocked kernels where that makes the same audio (:mod:`blocked`), then calibrated — or, with a
calibration cache (:mod:`calibration_cache`), all of that as an earlier start of the same voice,
code, libraries and CPU stored it: the stages' graphs as they run (as ONNX Runtime optimized
them while calibrating) and what calibration found, checked once more on this machine before
the voice is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from streamtts.piper.blocked import blocked_decoder
from streamtts.piper.calibration_cache import (
    CalibrationCache,
    StoredVoice,
    calibration_key,
    voice_digest,
)
from streamtts.piper.chain import Chained, Link
from streamtts.piper.reach import receptive_frames
from streamtts.piper.stages import (
    NOISE_SEED,
    PiperNotInstalledError,
    StagedVoice,
    Stages,
    calibrate,
    split_graph,
)

log = logging.getLogger(__name__)

# A model's path or bytes (and the name its optimized graph is kept under) -> its session.
Session = Callable[[str | bytes, str | None], Any]


def load_voice(
    model: Path,
    config: Path,
    onnx_threads: int,
    blocked: bool = True,
    calibration_threads: int = 1,
    cache: CalibrationCache | None = None,
) -> StagedVoice:
    """The voice, its sessions running ``onnx_threads`` intra-op threads each (Piper's own
    loader gives every session one thread per core: with several workers, more threads than
    cores); split, its decoder on blocked kernels where that makes the same audio (``blocked``;
    False keeps it as exported, for comparison), its context found and its gain measured (a few
    sentences' worth of work, on ``calibration_threads`` threads). With ``cache``: taken from an
    earlier start where that is stored and holds here, else stored once found."""
    if not model.is_file():
        raise FileNotFoundError(f"Piper voice not found: {model}")
    if cache is None:
        return _calibrated_voice(model, config, onnx_threads, blocked, calibration_threads)[0]
    digest = voice_digest(model, config)
    key = calibration_key(digest, onnx_threads, blocked)
    stored = cache.load(key)
    if stored is not None:
        voice = _restored_voice(model, config, onnx_threads, stored)
        if voice is not None:
            log.info("Piper voice %s: its calibration read from the cache", model.name)
            return voice
        log.warning("Piper voice %s: its stored calibration does not hold; calibrating", model)
    with _scratch_folder() as optimized:
        voice, parts = _calibrated_voice(
            model, config, onnx_threads, blocked, calibration_threads, optimized
        )
        if parts is None:
            cache.store(key, voice.calibration(), voice=digest)
        else:
            layout, graphs = _layout(parts, voice.flow_chained, voice.decodes_blocked, optimized)
            cache.store(key, voice.calibration(), layout, graphs, voice=digest)
    return voice


@contextlib.contextmanager
def _scratch_folder() -> Iterator[Path | None]:
    """A temporary folder for the sessions' optimized graphs; None where none can be made (the
    graphs are then stored as cut: the cache is only a shortcut)."""
    try:
        scratch = tempfile.TemporaryDirectory(prefix="streamtts-piper-")
    except OSError as exc:
        log.warning("Piper voice: no temporary folder (%s); its graphs are stored as cut", exc)
        yield None
        return
    with scratch as name:
        yield Path(name)


def _not_installed() -> PiperNotInstalledError:
    return PiperNotInstalledError("Piper is not installed: pip install 'streamtts[piper]'")


def _session_maker(
    onnx_threads: int, optimized_to: Path | None = None, optimized: bool = False
) -> Session:
    """Sessions of ``onnx_threads`` threads. With ``optimized_to``, each named session keeps
    its graph as ONNX Runtime optimized it there (under its name), so that a later start can
    load that instead; ``optimized``: the graphs given are such (nothing left to optimize:
    0.13 s instead of 0.68 s for the bundled voice's front on the 2-core dev machine)."""
    try:
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise _not_installed() from exc
    onnxruntime.set_seed(NOISE_SEED)

    def session(source: str | bytes, name: str | None = None) -> Any:
        if optimized_to is not None and name is not None:
            keep = options()
            keep.optimized_model_filepath = str(optimized_to / name)
            # It warns that the blocked layout suits only this CPU: the cache's key has the CPU.
            keep.log_severity_level = 3
            try:
                return make(source, keep)
            except Exception:  # e.g. a full disk: the graph is then stored as cut
                log.warning("Piper voice: its %s could not be kept optimized", name, exc_info=True)
        return make(source, options())

    def options() -> Any:
        made = onnxruntime.SessionOptions()
        made.intra_op_num_threads = onnx_threads
        made.inter_op_num_threads = 1
        if optimized:
            made.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        return made

    def make(source: str | bytes, session_options: Any) -> Any:
        return onnxruntime.InferenceSession(
            source, sess_options=session_options, providers=["CPUExecutionProvider"]
        )

    return session


def _staged_voice(config: Path, whole: Any, stages: Stages[Any] | None) -> StagedVoice:
    try:
        from piper import PiperVoice
        from piper.config import PiperConfig
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise _not_installed() from exc
    piper_config = PiperConfig.from_dict(json.loads(config.read_text(encoding="utf-8")))
    front = whole if stages is None else stages.front
    return StagedVoice(PiperVoice(session=front, config=piper_config), whole, stages)


def _calibrated_voice(
    model: Path,
    config: Path,
    onnx_threads: int,
    blocked: bool,
    calibration_threads: int,
    optimized_to: Path | None = None,
) -> tuple[StagedVoice, Stages[Any] | None]:
    """The voice calibrated, and the graphs of its stages as it runs them (None where it runs
    whole); with ``optimized_to``, its sessions' optimized graphs are kept there
    (:func:`_layout` names them)."""
    session = _session_maker(onnx_threads, optimized_to)
    voice, split = _cut(model, config, session)
    if split is None:
        log.warning("Piper voice %s: no decoder found in its graph; it runs whole", model)
        calibrate(voice, calibration_threads)
        return voice, None
    voice.decoder_reach_frames = receptive_frames(split.decoder, [split.latent_name])
    if split.flow is not None:
        voice.flow_reach_frames = receptive_frames(split.flow, list(split.prior_names))
    if blocked:
        rewritten = _adopt_blocked_decoder(voice, split, session)
        if rewritten is not None:
            split = dataclasses.replace(split, decoder=rewritten)
    calibrate(voice, calibration_threads)
    return voice, split


def _cut(model: Path, config: Path, session: Session) -> tuple[StagedVoice, Stages[Any] | None]:
    """The voice's graph cut into stages, and the voice running their sessions; where it
    cannot be cut, the voice running the graph whole (and None)."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise _not_installed() from exc
    split = split_graph(onnx.load(str(model)))
    if split is None:
        return _staged_voice(config, session(str(model), None), None), None
    # Where the flow has links, its whole graph runs only if they do not match: not kept.
    chained = bool(split.flow_links)
    names = {id(part): name for name, part in _part_files(split, chained).items()}
    stages = split.map(lambda part: session(part.SerializeToString(), names.get(id(part))))
    return _staged_voice(config, None, stages), split


def _adopt_blocked_decoder(voice: StagedVoice, split: Stages[Any], session: Session) -> Any:
    """The voice's decoder on ONNX Runtime's blocked kernels (:mod:`streamtts.piper.blocked`)
    where the rewrite applies and makes the same audio (its graph returned); else the decoder
    as exported (None)."""
    try:
        rewritten = blocked_decoder(split.decoder, split.latent_name)
        if rewritten is None:
            log.info("Piper voice: nothing in its decoder to run blocked")
        elif voice.adopt_decoder(session(rewritten.SerializeToString(), _BLOCKED_DECODER)):
            return rewritten
        else:
            log.warning("Piper voice: its decoder rewritten for blocked kernels differs; unused")
    except Exception:  # an unexpected graph: the decoder as exported still works
        log.warning(
            "Piper voice: its decoder could not be rewritten; it runs as exported", exc_info=True
        )
    return None


_BLOCKED_DECODER = "decoder.blocked.onnx"  # the rewritten decoder's optimized graph, until kept


def _part_files(split: Stages[Any], chained: bool) -> dict[str, Any]:
    """File name -> graph of each stage a voice runs: the flow as its links where they run it
    (``chained``), else whole."""
    parts = {"front.onnx": split.front, "decoder.onnx": split.decoder}
    if chained:
        parts |= {f"link{index}.onnx": link.part for index, link in enumerate(split.flow_links)}
    elif split.flow is not None:
        parts["flow.onnx"] = split.flow
    return parts


def _layout(
    split: Stages[Any], chained: bool, decodes_blocked: bool, optimized: Path | None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(layout, parts) to store: the stages' graphs a voice runs (as ONNX Runtime optimized
    them, kept in ``optimized`` as their sessions were made; as cut where there is no such
    folder or any is missing) and what joins them. ``split``'s decoder is the one in use
    (rewritten where it ``decodes_blocked``)."""
    graphs = _part_files(split, chained)
    files: dict[str, Path] = {}
    if optimized is not None:
        files = {name: optimized / name for name in graphs}
        if decodes_blocked:
            files["decoder.onnx"] = optimized / _BLOCKED_DECODER
    stored_optimized = bool(files) and all(path.is_file() for path in files.values())
    if stored_optimized:
        parts = {name: path.read_bytes() for name, path in files.items()}
    else:
        parts = {name: graph.SerializeToString() for name, graph in graphs.items()}
    links = [
        {
            "input_name": link.input_name,
            "output_name": link.output_name,
            "reach_frames": link.reach_frames,
        }
        for link in (split.flow_links if chained else ())
    ]
    layout = {
        "latent_name": split.latent_name,
        "prior_names": list(split.prior_names),
        "speaker_input": split.speaker_input,
        "flow": "flow.onnx" in parts,
        "links": links,
        "optimized": stored_optimized,
    }
    return layout, parts


def _stored_stages(stored: StoredVoice, onnx_threads: int) -> Stages[Any]:
    """The stages' sessions from the stored graphs (ValueError where the layout is not ours,
    whatever ONNX Runtime raises where a file is missing or damaged)."""
    layout, parts_dir = stored.layout, stored.parts_dir
    if layout is None or parts_dir is None:
        raise ValueError("no stored graphs")
    latent_name, prior_names = layout["latent_name"], layout["prior_names"]
    speaker_input, has_flow, links = layout["speaker_input"], layout["flow"], layout["links"]
    optimized = layout["optimized"]
    if not (
        isinstance(optimized, bool)
        and isinstance(latent_name, str)
        and isinstance(prior_names, list)
        and len(prior_names) == 2
        and all(isinstance(name, str) for name in prior_names)
        and isinstance(speaker_input, bool)
        and isinstance(has_flow, bool)
        and isinstance(links, list)
        and not (has_flow and links)
    ):
        raise ValueError("not a layout of stored stages")
    make = _session_maker(onnx_threads, optimized=optimized)

    def session(name: str) -> Any:
        return make(str(parts_dir / name), None)

    flow_links = tuple(
        Link(
            session(f"link{index}.onnx"),
            str(link["input_name"]),
            str(link["output_name"]),
            int(link["reach_frames"]),
        )
        for index, link in enumerate(links)
    )
    if flow_links:
        flow: Any = Chained(flow_links)
    else:
        flow = session("flow.onnx") if has_flow else None
    return Stages(
        session("front.onnx"),
        flow,
        session("decoder.onnx"),
        latent_name,
        (prior_names[0], prior_names[1]),
        speaker_input,
        flow_links,
    )


def _restored_voice(
    model: Path, config: Path, onnx_threads: int, stored: StoredVoice
) -> StagedVoice | None:
    """The voice as stored (its stages' graphs where stored, else cut again) with what its
    calibration found, if that holds here (:meth:`StagedVoice.restore`); else None."""
    calibration = stored.calibration
    voice: StagedVoice | None
    try:
        if stored.layout is not None:
            voice = _staged_voice(config, None, _stored_stages(stored, onnx_threads))
            voice.decodes_blocked = calibration.decodes_blocked
        else:
            session = _session_maker(onnx_threads)
            voice = _cut_again(model, config, session, calibration.decodes_blocked)
    except Exception:  # a damaged or foreign entry: calibrated afresh
        log.warning("Piper voice %s: its stored graphs do not load", model, exc_info=True)
        return None
    return voice if voice is not None and voice.restore(calibration) else None


def _cut_again(model: Path, config: Path, session: Session, blocked: bool) -> StagedVoice | None:
    """The voice's graph cut as calibration cut it (its decoder rewritten where ``blocked``),
    for an entry stored without its stages' graphs (a voice that runs whole)."""
    voice, split = _cut(model, config, session)
    if split is not None and blocked:
        rewritten = blocked_decoder(split.decoder, split.latent_name)
        if rewritten is None:
            return None
        voice.use_blocked_decoder(session(rewritten.SerializeToString(), None))
    return voice
