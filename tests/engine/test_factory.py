"""The engine a configuration names, for a server or for one offline stream."""

from __future__ import annotations

import pytest

from streamtts.config import Settings
from streamtts.engine.factory import ModelSpecError, create_engine
from streamtts.fish.engine import FishEngine
from streamtts.fish.settings import FishSettings


@pytest.mark.parametrize(("offline", "slots"), [(False, 3), (True, 1)])
async def test_an_offline_fish_engine_holds_one_slot(offline: bool, slots: int) -> None:
    """``streamtts say`` speaks one stream: one KV slot, so one warm-up stream (and one
    compiled bucket under ``compile``) instead of ``max_streams``."""
    settings = Settings(model="synthetic:tiny", fish=FishSettings(max_streams=3))
    engine = create_engine(settings, offline=offline)
    assert isinstance(engine, FishEngine)
    await engine.start()
    try:
        assert engine.describe()["max_streams"] == slots
    finally:
        await engine.stop()


def test_an_unknown_model_is_refused_with_what_is_known() -> None:
    with pytest.raises(ModelSpecError, match="unknown model 'nonsense'"):
        create_engine(Settings(model="nonsense"))
