"""Settings: nested sections, flat environment names, validation on construction."""

from __future__ import annotations

import pytest

from streamtts.config import Settings, SettingsError, leaves
from streamtts.fish.settings import FishSettings
from streamtts.limits import Limits
from streamtts.segmenter import SegmenterOptions


def test_each_setting_is_defined_once_and_named_flat() -> None:
    names = [name for name, _ in leaves(Settings())]
    assert len(names) == len(set(names))
    assert {"max_streams", "max_active_contexts", "max_buffer_delay_ms", "port"} <= set(names)


def test_environment_and_overrides_reach_their_sections() -> None:
    env = {
        "STREAMTTS_MAX_STREAMS": "3",
        "STREAMTTS_COMPILE": "yes",
        "STREAMTTS_MAX_ACTIVE_CONTEXTS": "5",
        "STREAMTTS_MIN_SEGMENT_CHARS": "0",
        "STREAMTTS_ENGINE_THREADS": "4",
        "STREAMTTS_PORT": "1234",
    }
    settings = Settings.from_env(env, port=9000, model=None)
    assert settings.fish == FishSettings(max_streams=3, compile=True)
    assert settings.limits == Limits(max_active_contexts=5)
    assert settings.segmenter == SegmenterOptions(min_segment_chars=0)
    assert settings.piper.engine_threads == 4
    assert settings.port == 9000  # flags win; None means "not given"
    assert settings.model == "piper"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STREAMTTS_MAX_STREAMS": "0"}, "max_streams must be >= 1"),
        ({"STREAMTTS_MAX_STREAMS": "many"}, "STREAMTTS_MAX_STREAMS='many' is not a valid int"),
        ({"STREAMTTS_COMPILE": "maybe"}, "not a valid bool"),
        ({"STREAMTTS_IDLE_TIMEOUT_S": "-1"}, "idle_timeout_s must be >= 0"),
        ({"STREAMTTS_FIRST_SEGMENT_MIN_CHARS": "900"}, "first_segment_min_chars"),
        ({"STREAMTTS_DTYPE": "fp8"}, "dtype must be one of"),
        ({"STREAMTTS_PORT": "0"}, "port must be 1..65535"),
        ({"STREAMTTS_SSL_CERTFILE": "cert.pem"}, "TLS needs both ssl_certfile and ssl_keyfile"),
        ({"STREAMTTS_SSL_KEYFILE": "key.pem"}, "TLS needs both ssl_certfile and ssl_keyfile"),
    ],
)
def test_bad_values_are_refused_clearly(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_tls_from_the_environment() -> None:
    settings = Settings.from_env({"STREAMTTS_SSL_CERTFILE": "c.pem", "STREAMTTS_SSL_KEYFILE": "k"})
    assert settings.tls and settings.ssl_certfile == "c.pem" and settings.ssl_keyfile == "k"
    assert not Settings().tls


def test_sections_validate_on_construction_not_only_from_the_environment() -> None:
    with pytest.raises(SettingsError):
        FishSettings(max_streams=0)
    with pytest.raises(SettingsError):
        Limits(max_active_contexts=0)
    with pytest.raises(SettingsError, match="unknown settings"):
        Settings().replace(max_stream=2)
    changed = Settings().replace(max_streams=2, host="0.0.0.0")
    assert changed.fish.max_streams == 2 and changed.host == "0.0.0.0"
    assert Settings().replace() == Settings()


def test_api_keys_never_show_in_a_repr() -> None:
    assert "s3cret" not in repr(Settings().replace(api_keys="s3cret"))
