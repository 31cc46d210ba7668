"""Checkpoint loading: upstream key tolerances, clear errors, and peak memory at full size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from streamtts.models.fish.llm.checkpoint import (
    CONFIG_FILE,
    MODEL_FILE,
    TOKENIZER_FILE,
    CheckpointError,
    load_fish_llm,
)
from streamtts.models.fish.llm.synthetic import write_synthetic_checkpoint
from tests.fish_fixture import read

LLM_INPUT_FILE = "llm_input.npy"


def copy_checkpoint(src: Path, dst: Path, state: dict[str, object] | None = None) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_FILE, TOKENIZER_FILE):
        shutil.copy(src / name, dst / name)
    if state is None:
        shutil.copy(src / MODEL_FILE, dst / MODEL_FILE)
    else:
        torch.save(state, dst / MODEL_FILE)
    return dst


def fixture_state(directory: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(directory / MODEL_FILE, weights_only=True)
    return state


def split_qkv(state: dict[str, torch.Tensor], q_rows: int, kv_rows: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith("wqkv.weight"):
            base = key[: -len("wqkv.weight")]
            q, k, v = torch.split(value, [q_rows, kv_rows, kv_rows])
            out |= {f"{base}wq.weight": q, f"{base}wk.weight": k, f"{base}wv.weight": v}
        else:
            out[key] = value
    return out


@torch.no_grad()
def test_loader_tolerances_give_identical_model(fish_fixture_dir: Path, tmp_path: Path) -> None:
    reference = load_fish_llm(fish_fixture_dir, torch.float32).model
    tokens = torch.from_numpy(read(fish_fixture_dir, LLM_INPUT_FILE))
    expected = reference.forward_train(tokens)
    cfg = reference.config
    state = fixture_state(fish_fixture_dir)
    split = split_qkv(state, cfg.n_head * cfg.head_dim, cfg.n_local_heads * cfg.head_dim)
    assert any(k.endswith("wq.weight") for k in split)
    variants: dict[str, dict[str, object]] = {
        "nested": {"state_dict": state},
        "prefixed": {f"model.{k}": v for k, v in state.items()},
        "split_qkv_nested_prefixed": {"state_dict": {f"model.{k}": v for k, v in split.items()}},
    }
    for name, variant in variants.items():
        directory = copy_checkpoint(fish_fixture_dir, tmp_path / name, variant)
        model = load_fish_llm(directory, torch.float32).model
        got = model.forward_train(tokens)
        assert torch.equal(got.logits, expected.logits), name
        assert torch.equal(got.codebook_logits, expected.codebook_logits), name


def test_bf16_on_disk_cast_to_run_dtype(fish_fixture_dir: Path) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        model = load_fish_llm(fish_fixture_dir, dtype).model
        assert {p.dtype for p in model.parameters()} == {dtype}
        assert not any(p.requires_grad for p in model.parameters())


def test_missing_directory_and_files(tmp_path: Path, fish_fixture_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        load_fish_llm(tmp_path / "nope")
    directory = copy_checkpoint(fish_fixture_dir, tmp_path / "partial")
    (directory / TOKENIZER_FILE).unlink()
    with pytest.raises(CheckpointError, match=TOKENIZER_FILE):
        load_fish_llm(directory)


def test_incompatible_checkpoints(tmp_path: Path, fish_fixture_dir: Path) -> None:
    state = fixture_state(fish_fixture_dir)
    missing = copy_checkpoint(
        fish_fixture_dir,
        tmp_path / "missing",
        {k: v for k, v in state.items() if "fast_norm" not in k},
    )
    with pytest.raises(CheckpointError, match="lacks"):
        load_fish_llm(missing)
    wrong = copy_checkpoint(fish_fixture_dir, tmp_path / "wrong")
    config = json.loads((wrong / CONFIG_FILE).read_text())
    config["intermediate_size"] = config["intermediate_size"] * 2
    config["fast_intermediate_size"] = None
    (wrong / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not fit"):
        load_fish_llm(wrong)
    garbage = copy_checkpoint(fish_fixture_dir, tmp_path / "garbage")
    (garbage / MODEL_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_fish_llm(garbage)


_CHILD = textwrap.dedent(
    """
    import json, sys, time, torch
    from streamtts.models.fish.llm.checkpoint import load_fish_llm

    def hwm_kb():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("no VmHWM")

    torch.set_num_threads(1)
    base = hwm_kb()
    start = time.perf_counter()
    llm = load_fish_llm(sys.argv[1], torch.bfloat16)
    load_s = time.perf_counter() - start
    touched = sum(float(p.sum()) for p in llm.model.parameters())  # page every weight in
    with torch.no_grad():
        prompt = torch.zeros(llm.config.num_codebooks + 1, 4, dtype=torch.int32)
        logits = llm.model.prefill(llm.model.allocate_cache(1, 64), prompt, slot=0).logits
    print(json.dumps({"base_kb": base, "peak_kb": hwm_kb(), "load_s": load_s,
                      "finite": bool(torch.isfinite(logits).all()), "touched": touched}))
    """
)


@pytest.mark.slow
def test_full_size_load_peaks_below_twice_the_file(tmp_path: Path) -> None:
    directory = write_synthetic_checkpoint(tmp_path / "synthetic-1.5", "1.5", torch.bfloat16)
    file_kb = (directory / MODEL_FILE).stat().st_size // 1024
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["finite"]
    assert file_kb > 1_200_000  # really the full-size model in bf16 (≈ 1.28 GB)
    assert report["peak_kb"] < 2 * file_kb, report
