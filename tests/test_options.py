"""The option table: types, ranges, defaults, and which engine honours what."""

from __future__ import annotations

import pytest

from streamtts.options import (
    BY_NAME,
    FISH,
    OPTIONS,
    PIPER,
    OptionError,
    SynthesisOptions,
    describe_options,
    parse_options,
    refuse_unhonoured,
)


def test_every_field_of_synthesis_options_is_in_the_table_once() -> None:
    names = [o.name for o in OPTIONS]
    assert len(names) == len(set(names))
    assert set(names) == set(SynthesisOptions().__dataclass_fields__)
    assert all(o.engines for o in OPTIONS)


@pytest.mark.parametrize(
    ("name", "inside", "outside"),
    [
        ("speed", [0.25, 1, 4.0], [0.24, 4.01]),
        ("temperature", [0.01, 1.99], [0.0, 2.0]),
        ("top_p", [1e-4, 1.0], [0.0, 1.01]),
        ("repetition_penalty", [0.5, 1.99], [0.0, 2.0]),
        ("seed", [0, 2**63 - 1], [-1, 2**63]),
        ("chunk_frames", [1, 256], [0, 257]),
    ],
)
def test_ranges(name: str, inside: list[float], outside: list[float]) -> None:
    option = BY_NAME[name]
    for value in inside:
        assert option.check(value) == value
    for value in outside:
        with pytest.raises(OptionError) as info:
            option.check(value)
        assert info.value.option == name and name in info.value.message


@pytest.mark.parametrize("value", [True, "1", None, [], float("nan"), float("inf")])
def test_types(value: object) -> None:
    with pytest.raises(OptionError, match="number"):
        BY_NAME["speed"].check(value)


def test_integers_are_integers() -> None:
    with pytest.raises(OptionError, match="integer"):
        BY_NAME["seed"].check(3.0)
    assert isinstance(BY_NAME["speed"].check(2), float)


def test_parsing_turns_defaults_into_unset_and_skips_nulls() -> None:
    parsed = parse_options({"speed": 1.0, "temperature": 0.7, "top_p": 0.5, "seed": None})
    assert parsed == SynthesisOptions(top_p=0.5)
    assert parsed.set_options() == {"top_p": 0.5}
    with pytest.raises(OptionError, match="unknown option 'warp'"):
        parse_options({"warp": 2})


def test_synthesis_options_are_validated_on_construction() -> None:
    with pytest.raises(OptionError, match="top_p"):
        SynthesisOptions(top_p=0.0)


@pytest.mark.parametrize(
    ("kind", "options", "refused"),
    [
        (PIPER, SynthesisOptions(seed=1), "seed"),
        (PIPER, SynthesisOptions(top_p=0.5), "top_p"),
        (FISH, SynthesisOptions(speed=1.5), "speed"),
        (PIPER, SynthesisOptions(speed=1.5), None),
        (FISH, SynthesisOptions(seed=1, chunk_frames=4), None),
        (PIPER, SynthesisOptions(), None),
    ],
)
def test_what_each_engine_honours(
    kind: str, options: SynthesisOptions, refused: str | None
) -> None:
    if refused is None:
        refuse_unhonoured(options, kind)
        return
    with pytest.raises(OptionError) as info:
        refuse_unhonoured(options, kind)
    assert info.value.option == refused
    assert f"not supported by the {kind} engine" in info.value.message


def test_descriptions_list_only_what_an_engine_takes() -> None:
    assert [o["name"] for o in describe_options(PIPER)] == ["speed"]
    fish = {o["name"]: o for o in describe_options(FISH)}
    assert "speed" not in fish and fish["top_p"]["range"] == "0 < top_p ≤ 1"
    assert fish["seed"]["default"] is None and fish["temperature"]["default"] == 0.7


def test_the_protocol_docs_list_every_option_with_its_range() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "protocol.md").read_text()
    for option in OPTIONS:
        assert f"`{option.name}`" in doc and option.range_text() in doc, option.name


def test_the_protocol_docs_list_every_transport_field() -> None:
    from pathlib import Path

    from streamtts.options import TRANSPORT_FIELDS

    doc = (Path(__file__).parents[1] / "docs" / "protocol.md").read_text()
    for interface, names in TRANSPORT_FIELDS.items():
        for name in names:
            assert f"`{name}`" in doc, (interface, name)
