"""The Fish-Speech reference fixture set: where it is, and its cases as ``index.json`` lists them.

The set is a tiny checkpoint directory in the upstream format with upstream's outputs in
``expected/`` (see ``tests/fixtures/README.md``). It lives in this repository; the environment
variable ``STREAMTTS_FISH_FIXTURE`` points the tests at another set of the same format.

Tests take their cases from the ``files`` of ``expected/index.json`` by name pattern, so any set
of the format is checked in full. Inputs (``llm_input``, ``dec_codes``, ``fast_hidden_in`` ...)
are read by name; a missing file fails with its name (never a ``KeyError``, never a skip).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from streamtts.models.fish.llm.tokenizer import FishTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "fish15-tiny"
ENV_VAR = "STREAMTTS_FISH_FIXTURE"

Index = dict[str, Any]


def fixture_dir() -> Path:
    return Path(os.environ.get(ENV_VAR, str(DEFAULT_FIXTURE)))


def load_index(directory: Path) -> Index:
    with open(directory / "expected" / "index.json", encoding="utf-8") as f:
        index: Index = json.load(f)
    return index


@functools.cache
def cached_index(directory: Path) -> Index:
    return load_index(directory)


def read(directory: Path, name: str) -> npt.NDArray[Any]:
    """:func:`expected` with the set's index looked up once per directory."""
    return expected(directory, cached_index(directory), name)


def require_dir(directory: Path) -> Path:
    if not (directory / "expected" / "index.json").is_file():
        pytest.fail(f"Fish fixture set not found at {directory} (set {ENV_VAR})")
    return directory


def entries(pattern: str) -> list[str]:
    """Names of ``expected/`` files that fully match ``pattern``, for parametrisation.

    Without an index it returns one placeholder, so the test runs and fails through
    :func:`require_dir` instead of being skipped; a set with no such file is an error too.
    """
    index_path = fixture_dir() / "expected" / "index.json"
    if not index_path.is_file():
        return [f"<missing {index_path}>"]
    names = sorted(n for n in load_index(fixture_dir())["files"] if re.fullmatch(pattern, n))
    return names or [f"<no file matching {pattern!r} in {index_path}>"]


def meta(index: Index, name: str) -> dict[str, Any]:
    """The index entry of ``name``; fails clearly when the set lacks it."""
    found: dict[str, Any] | None = index["files"].get(name)
    if found is None:
        pytest.fail(f"the fixture set's index.json lists no {name!r}")
    return found


def expected(directory: Path, index: Index, name: str) -> npt.NDArray[Any]:
    """``expected/<name>``, asserting the dtype and shape that index.json declares."""
    info = meta(index, name)
    path = directory / "expected" / name
    if not path.is_file():
        pytest.fail(f"the fixture set lacks {path}, which its index.json lists")
    array: npt.NDArray[Any] = np.load(path)
    assert str(array.dtype) == info["dtype"], name
    assert list(array.shape) == info["shape"], name
    return array


def sibling(name: str, old: str, new: str) -> str:
    """``sibling("gen_en_fp32_y.npy", "y", "frames")`` is ``gen_en_fp32_frames.npy``."""
    suffix = f"_{old}.npy"
    assert name.endswith(suffix), (name, suffix)
    return name[: -len(suffix)] + f"_{new}.npy"


# ---- what an upstream call recorded in index.json says ------------------------------------

_CODES_ARG = re.compile(r"(?:indices=|decode\()(\w+)\[None(?:,\s*:,\s*(\d+):(\d+))?\]")


def decode_source(index: Index, name: str) -> tuple[str, slice]:
    """Which codes file (and which frame slice of it) upstream decoded to produce ``name``.

    Parsed from the recorded call, e.g. ``v.decode(indices=dec_codes[None,:, 0:17], …`` or
    ``v.quantizer.decode(dec_codes[None])[0]``. A call recorded as ``v.decode(...)`` under
    autocast repeats the fp32 entry of the same name (``dec_audio_bf16autocast`` →
    ``dec_audio_fp32``).
    """
    call = meta(index, name)["call"]
    if "decode(...)" in call and "_bf16autocast" in name:
        return decode_source(index, name.replace("_bf16autocast", "_fp32"))
    found = _CODES_ARG.search(call)
    assert found, f"cannot tell which codes {name} decodes: {call!r}"
    frames = slice(None) if found[2] is None else slice(int(found[2]), int(found[3]))
    return f"{found[1]}.npy", frames


# Every fp32 decode upstream made from zero state: whole code files, chunks, generated codes.
FP32_DECODE = r"dec_audio(_\w+)?_fp32\.npy|gen_\w+_fp32_audio\.npy"


def fp32_decodes(index: Index) -> list[str]:
    names = sorted(n for n in index["files"] if re.fullmatch(FP32_DECODE, n))
    if not names:
        pytest.fail("the fixture set has no fp32 decode (dec_audio*_fp32, gen_*_fp32_audio)")
    return names


def codes_for(directory: Path, index: Index, output: str) -> torch.Tensor:
    """The codes upstream decoded to make ``output``: [8, N] int64."""
    codes_file, frames = decode_source(index, output)
    codes = expected(directory, index, codes_file)[:, frames]
    return torch.from_numpy(np.ascontiguousarray(codes)).long()


def number_argument(call: str, name: str) -> float:
    found = re.search(rf"\b{name}=([0-9.eE+-]+)", call)
    assert found, f"{name} not in {call!r}"
    return float(found.group(1))


def generation_call(index: Index, name: str) -> dict[str, Any]:
    """Text, seed, frame budget and sampling of the upstream ``generate_long`` call of ``name``."""
    call = meta(index, name)["call"]
    text_key = re.search(r"text=texts\['(\w+)'\]", call)
    seed = re.search(r"torch\.manual_seed\((\d+)\)", call)
    assert text_key and seed, call
    assert "prompt_text=[]" in call, f"{name}: generation with references is not handled yet"
    return {
        "text": index["texts"][text_key.group(1)],
        "seed": int(seed.group(1)),
        "max_new_tokens": int(number_argument(call, "max_new_tokens")),
        "temperature": number_argument(call, "temperature"),
        "top_p": number_argument(call, "top_p"),
        "repetition_penalty": number_argument(call, "repetition_penalty"),
    }


# ---- the spec's prompt layout, written out independently of the prompt builder -----------


def expected_turn(tokenizer: FishTokenizer, text: str) -> list[int]:
    """The user turn and generation prefix of spec §3.3-3.4, each part tokenised alone."""
    parts = ["<|im_start|>user\n", text, "<|im_end|>", "<|im_start|>assistant\n", "<|voice|>"]
    return [token for part in parts for token in tokenizer.encode(part)]
