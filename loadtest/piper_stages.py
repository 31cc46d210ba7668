"""The bundled Piper voice's stages on this machine, its decoder as exported against blocked.

    python -m loadtest.piper_stages [--rounds 5] [--json out.json]

Loads the voice twice, once with its decoder as exported and once rewritten for ONNX Runtime's
blocked convolution kernels (``streamtts.piper.blocked``), on one intra-op thread each (the
engine's default; from the server's calibration cache where stored there), and times, for
each sentence of the load test's paragraphs: the front stage (phonemes to the flow's prior),
the whole sentence's audio (flow and decoder), its first window (the engine's ``HEAD_FRAMES``
with their context) and the sentence made as the engine makes a listener's first one (that
window, then the rest: ``split``), with each voice, in rounds that alternate which voice goes
first. Prints each round and the medians, as compute seconds per audio second and as the ratio
exported/blocked measured in the same rounds; JSON to stdout (and ``--json``). In process, no
server.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from loadtest import print_result
from loadtest.__main__ import TEXTS
from streamtts.config import Settings
from streamtts.piper.engine import HEAD_FRAMES, bundled_voice_paths
from streamtts.piper.load import load_voice
from streamtts.piper.stages import Sentence, StagedVoice


def _timed(fn: Callable[..., Any], *args: Any) -> float:
    started_s = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started_s


def _add(totals: dict[str, float], key: str, seconds: float) -> None:
    totals[key] = totals.get(key, 0.0) + seconds


def _sentences() -> list[str]:
    return [s.strip() for text in TEXTS for s in re.findall(r"[^.?!]+[.?!]", text)]


def _fresh(sentence: Sentence) -> Sentence:
    """The same front output with no flow output kept (each voice runs its own flow)."""
    return Sentence(sentence.arrays)


def one_round(voices: dict[str, StagedVoice], order: list[str]) -> dict[str, float]:
    """Seconds of compute (summed over the sentences) per stage and voice, and audio seconds."""
    totals: dict[str, float] = {"audio_s": 0.0, "front_s": 0.0}
    reference = voices[order[0]]
    scales = reference.scales(1.0)
    for text in _sentences():
        for ids in reference.phoneme_ids(text):
            started_s = time.perf_counter()
            sentence = reference.sentence(ids, scales)
            totals["front_s"] += time.perf_counter() - started_s
            frames = reference.frames(sentence)
            totals["audio_s"] += frames * reference.hop_samples / reference.sample_rate
            for name in order:
                voice = voices[name]
                _add(totals, f"{name}_whole_s", _timed(voice.render, _fresh(sentence)))
                windowed = _fresh(sentence)  # its first window, then the rest of it
                head_s = _timed(voice.render, windowed, 0, HEAD_FRAMES)
                _add(totals, f"{name}_head_s", head_s)
                _add(
                    totals, f"{name}_split_s", head_s + _timed(voice.render, windowed, HEAD_FRAMES)
                )
    return totals


def summary(rounds: list[dict[str, float]], heads: int) -> dict[str, Any]:
    def per_audio(key: str) -> float:
        return round(statistics.median(r[key] / r["audio_s"] for r in rounds), 4)

    def head_ms(name: str) -> float:
        return round(1000 * statistics.median(r[f"{name}_head_s"] / heads for r in rounds), 2)

    return {
        "rounds": len(rounds),
        "audio_s_per_round": round(rounds[0]["audio_s"], 2),
        "front_s_per_audio_s": per_audio("front_s"),
        "exported_whole_s_per_audio_s": per_audio("exported_whole_s"),
        "blocked_whole_s_per_audio_s": per_audio("blocked_whole_s"),
        "exported_split_s_per_audio_s": per_audio("exported_split_s"),
        "blocked_split_s_per_audio_s": per_audio("blocked_split_s"),
        "whole_ratio": round(
            statistics.median(r["exported_whole_s"] / r["blocked_whole_s"] for r in rounds), 3
        ),
        "exported_first_window_ms": head_ms("exported"),
        "blocked_first_window_ms": head_ms("blocked"),
        "first_window_ratio": round(
            statistics.median(r["exported_head_s"] / r["blocked_head_s"] for r in rounds), 3
        ),
        "first_window_frames": HEAD_FRAMES,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    model, config = bundled_voice_paths()
    print("loading the voice twice (exported and blocked decoder)...", file=sys.stderr)
    cache = Settings.from_env().piper.calibration_cache()  # the server's, as it runs the voice
    voices = {
        "exported": load_voice(model, config, onnx_threads=1, blocked=False, cache=cache),
        "blocked": load_voice(model, config, onnx_threads=1, blocked=True, cache=cache),
    }
    if not voices["blocked"].decodes_blocked:
        print("the blocked decoder was not adopted on this machine", file=sys.stderr)
        return 1
    heads = sum(len(voices["exported"].phoneme_ids(t)) for t in _sentences())
    one_round(voices, ["exported", "blocked"])  # warm-up
    rounds = []
    for index in range(args.rounds):
        order = ["exported", "blocked"] if index % 2 == 0 else ["blocked", "exported"]
        rounds.append(one_round(voices, order))
        latest = summary(rounds[-1:], heads)
        print(
            f"  round {index + 1}/{args.rounds} ({order[0]} first): whole "
            f"{latest['exported_whole_s_per_audio_s']} vs {latest['blocked_whole_s_per_audio_s']}"
            f" s/s ({latest['whole_ratio']}x), first window {latest['exported_first_window_ms']}"
            f" vs {latest['blocked_first_window_ms']} ms, first window and rest "
            f"{latest['exported_split_s_per_audio_s']} vs {latest['blocked_split_s_per_audio_s']}"
            " s/s",
            file=sys.stderr,
        )
    result = summary(rounds, heads)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
