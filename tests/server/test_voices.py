"""``/v1/voices`` on a real server: a reference spoken by the bundled Piper voice is uploaded to
a Fish server (``synthetic:tiny``, and the upstream-format fixture checkpoint), spoken with over
the native socket and the OpenAI route, kept across a restart, deleted; every bad upload is
refused with its documented code and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fish_audio_sdk
import httpx
import msgpack
import numpy as np
import pytest
from fishaudio import FishAudio, ReferenceAudio
from fishaudio.exceptions import APIError

from streamtts.config import Settings
from streamtts.engine.base import Engine
from streamtts.fish.engine import FishEngine
from streamtts.options import PIPER
from tests.app_server import RunningApp, serve_app, serve_app_in_thread
from tests.audio_files import bundled_voice_speech, encode, tone
from tests.fake_engine import FakeEngine
from tests.fish_fixture import fixture_dir, require_dir
from tests.ws_client import StreamClient

TRANSCRIPT = "This is my own voice. I read a few sentences so the model can learn how I sound."


@pytest.fixture(scope="module")
def reference_wav() -> bytes:
    """Real speech (the bundled voice) as a WAV file, made here."""
    samples, rate = asyncio.run(bundled_voice_speech(TRANSCRIPT))
    assert 2.0 < samples.size / rate < 30.0
    return encode(samples, rate, "wav")


def fish(directory: Path, spec: str = "synthetic:tiny") -> tuple[FishEngine, Settings]:
    settings = Settings().replace(voices_dir=str(directory), dtype="fp32", max_streams=2)
    return FishEngine(spec, settings.fish), settings


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[RunningApp]:
    engine, settings = fish(tmp_path / "voices")
    async with serve_app(engine, settings) as running:
        yield running


async def post_voice(
    http: httpx.AsyncClient, audio: bytes | None, filename: str = "me.wav", **fields: str
) -> httpx.Response:
    files = {"audio": (filename, audio, "application/octet-stream")} if audio is not None else {}
    data = {"text": TRANSCRIPT, **fields}
    return await http.post("/v1/voices", data=data, files=files or None)


async def speak_native(
    app: RunningApp, voice: str, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    client = await StreamClient.open(app.ws_url)
    await client.send(type="start", context="c", voice=voice, options=options or {})
    first = await client.until(lambda m: m.get("context") == "c", timeout_s=30)
    if first["type"] == "error":
        await client.close()
        return first
    await client.send(type="text", context="c", text="Hello from my cloned voice.")
    await client.send(type="end", context="c")
    result = await client.until_done("c", timeout_s=60)
    await client.close()
    assert result.done is not None
    return {**result.done, "audio_bytes": len(result.audio)}


async def test_a_cloned_voice_is_added_spoken_kept_and_deleted(
    tmp_path: Path, reference_wav: bytes
) -> None:
    folder = tmp_path / "voices"
    engine, settings = fish(folder)
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        response = await post_voice(http, reference_wav, name="My voice", id="mine")
        assert response.status_code == 201, response.text
        voice = response.json()
        assert voice["id"] == "mine" and voice["name"] == "My voice" and voice["cloned"]
        assert voice["engine"] == "fish" and voice["text"] == TRANSCRIPT
        assert voice["frames"] == pytest.approx(voice["duration_s"] * 21.53, abs=2)
        listed = (await http.get("/v1/voices")).json()["voices"]
        assert [v["id"] for v in listed] == ["default", "mine"]
        assert (await http.get("/v1/audio/voices")).json()["voices"] == listed
        assert (await http.get("/v1/voices/mine")).json() == voice
        done = await speak_native(app, "mine")
        assert done["reason"] == "end" and done["audio_bytes"] > 0
        speech = await http.post(
            "/v1/audio/speech",
            json={"input": "Hello again.", "voice": "mine", "response_format": "pcm"},
        )
        assert speech.status_code == 200 and len(speech.content) > 0
        assert (folder / "mine" / "reference.wav").read_bytes() == reference_wav

    # A restart keeps it.
    engine, settings = fish(folder)
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        assert (await http.get("/v1/voices/mine")).status_code == 200
        assert (await speak_native(app, "mine"))["reason"] == "end"
        assert (await http.delete("/v1/voices/mine")).status_code == 204
        assert (await http.get("/v1/voices/mine")).status_code == 404
        assert (await http.delete("/v1/voices/mine")).json()["error"]["code"] == "voice_not_found"
        refused = await speak_native(app, "mine")
        assert refused["type"] == "error" and refused["code"] == "unknown_voice"
        builtin = await http.delete("/v1/voices/default")
        assert builtin.status_code == 400 and builtin.json()["error"]["code"] == "builtin_voice"
        assert not (folder / "mine").exists()


async def test_the_fixture_checkpoint_clones_with_its_real_encoder(
    tmp_path: Path, reference_wav: bytes
) -> None:
    engine, settings = fish(tmp_path, str(require_dir(fixture_dir())))
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        response = await post_voice(http, reference_wav, id="fixture-voice")
        assert response.status_code == 201, response.text
        codes = np.load(tmp_path / "fixture-voice" / "codes.npy")
        assert codes.shape == (8, response.json()["frames"]) and codes.dtype == np.int32
        assert int(codes.min()) >= 0 and int(codes.max()) < 1000
        # A real (tiny) checkpoint stops when it says so: bound its frames.
        spoken = await speak_native(app, "fixture-voice", {"max_frames_per_segment": 16})
        assert spoken["reason"] == "end" and spoken["audio_bytes"] > 0


@pytest.mark.parametrize(
    ("audio", "fields", "status", "code"),
    [
        (None, {}, 400, "missing_audio"),
        (b"", {}, 400, "missing_audio"),
        (b"this is not audio" * 100, {}, 415, "unsupported_audio"),
        ("short", {}, 400, "audio_too_short"),
        ("long", {}, 400, "audio_too_long"),
        ("ok", {"text": ""}, 400, "missing_text"),
        ("ok", {"id": "Not A Slug"}, 400, "invalid_voice_id"),
        ("ok", {"id": "default"}, 400, "reserved_voice_id"),
        ("ok", {"colour": "blue"}, 400, "invalid_form"),
    ],
)
async def test_bad_uploads_get_their_documented_errors(
    app: RunningApp, audio: bytes | str | None, fields: dict[str, str], status: int, code: str
) -> None:
    made = {
        "short": encode(tone(1.0), 22_050, "wav"),
        "long": encode(tone(31.0), 22_050, "flac"),
        "ok": encode(tone(3.0), 22_050, "wav"),
    }
    data = made[audio] if isinstance(audio, str) else audio
    async with httpx.AsyncClient(base_url=app.url) as http:
        response = await post_voice(http, data, **fields)
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert [v["id"] for v in (await http.get("/v1/voices")).json()["voices"]] == ["default"]


async def test_a_body_over_the_upload_limit_is_refused_unread(tmp_path: Path) -> None:
    engine, settings = fish(tmp_path)
    settings = settings.replace(max_voice_upload_bytes=50_000)
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        big = encode(tone(5.0, 22_050), 22_050, "wav")  # 220 kB
        declared = await post_voice(http, big)
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "upload_too_large"

        body = (
            b'--abc\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\n'
            + big
            + b"\r\n--abc--\r\n"
        )

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: bounded while read
            for start in range(0, len(body), 10_000):
                yield body[start : start + 10_000]

        streamed = await http.post(
            "/v1/voices",
            content=chunked(),
            headers={"content-type": "multipart/form-data; boundary=abc"},
        )
        assert streamed.status_code == 413, streamed.text
        plain = await http.post("/v1/voices", json={"audio": "no"})
        assert plain.status_code == 400 and plain.json()["error"]["code"] == "invalid_form"


async def test_concurrent_uploads(app: RunningApp, reference_wav: bytes) -> None:
    async with httpx.AsyncClient(base_url=app.url, timeout=120) as http:
        same = await asyncio.gather(*(post_voice(http, reference_wav, id="same") for _ in range(4)))
        assert sorted(r.status_code for r in same) == [201, 409, 409, 409]
        others = await asyncio.gather(
            *(post_voice(http, reference_wav, id=f"voice-{i}") for i in range(3))
        )
        assert all(r.status_code == 201 for r in others)
        ids = [v["id"] for v in (await http.get("/v1/voices")).json()["voices"]]
        assert ids == ["default", "same", "voice-0", "voice-1", "voice-2"]


async def test_the_library_is_bounded_and_ids_unique(tmp_path: Path) -> None:
    engine, settings = fish(tmp_path)
    settings = settings.replace(max_voices=1)
    reference = encode(tone(3.0), 22_050, "wav")
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        assert (await post_voice(http, reference, id="one")).status_code == 201
        again = await post_voice(http, reference, id="one")
        assert again.status_code == 409 and again.json()["error"]["code"] == "voice_exists"
        full = await post_voice(http, reference, id="two")
        assert full.status_code == 409 and full.json()["error"]["code"] == "too_many_voices"


async def test_an_engine_that_cannot_clone_says_so(tmp_path: Path) -> None:
    engine: Engine = FakeEngine(PIPER)
    settings = Settings().replace(voices_dir=str(tmp_path))
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        response = await post_voice(http, encode(tone(3.0), 22_050, "wav"))
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "cloning_not_supported"


async def test_voice_routes_need_a_key_when_keys_are_set(tmp_path: Path) -> None:
    engine, settings = fish(tmp_path)
    settings = settings.replace(api_keys="sekrit")
    async with serve_app(engine, settings) as app, httpx.AsyncClient(base_url=app.url) as http:
        assert (await http.get("/v1/voices")).status_code == 401
        refused = await post_voice(http, encode(tone(3.0), 22_050, "wav"))
        assert refused.status_code == 401
        http.headers["Authorization"] = "Bearer sekrit"
        assert (await http.get("/v1/voices")).status_code == 200


async def test_a_voice_another_replica_adds_is_found_on_first_use(
    tmp_path: Path, reference_wav: bytes
) -> None:
    """Two servers share one voices folder; the second knows a voice the first added as soon
    as a client asks for it (a rescan on a miss), long before its periodic rescan."""
    one_engine, settings = fish(tmp_path)
    two_engine, _ = fish(tmp_path)
    settings = settings.replace(voices_rescan_s=3600.0)
    async with serve_app(one_engine, settings) as one, serve_app(two_engine, settings) as two:
        async with httpx.AsyncClient(base_url=one.url) as http:
            assert (await post_voice(http, reference_wav, id="from-one")).status_code == 201
        assert (await speak_native(two, "from-one"))["reason"] == "end"


async def test_a_fish_api_inline_reference_speaks_as_the_stored_voice_of_it(
    app: RunningApp, reference_wav: bytes
) -> None:
    """``references`` of ``POST /v1/tts``: encoded for the one request, not stored, and the same
    voice as the stored one made of the same recording (same seed, same audio)."""
    inline = [{"audio": reference_wav, "text": TRANSCRIPT}]
    request = {"text": "Hello from my cloned voice.", "format": "pcm", "seed": 5}
    headers = {"content-type": "application/msgpack"}
    async with httpx.AsyncClient(base_url=app.url, timeout=120) as http:

        async def tts(**fields: Any) -> httpx.Response:
            body = msgpack.packb({**request, **fields}, use_bin_type=True)
            return await http.post("/v1/tts", content=body, headers=headers)

        spoken_inline = await tts(references=inline)
        assert spoken_inline.status_code == 200, spoken_inline.text
        listed = (await http.get("/v1/voices")).json()["voices"]
        assert not any(v["cloned"] for v in listed)  # nothing was stored
        assert (await post_voice(http, reference_wav, id="mine")).status_code == 201
        spoken_stored = await tts(reference_id="mine")
        spoken_default = await tts()
        assert spoken_inline.content == spoken_stored.content
        assert spoken_inline.content != spoken_default.content

        too_short = await tts(
            references=[{"audio": encode(tone(0.5), 22_050, "wav"), "text": "Hi."}]
        )
        assert too_short.status_code == 400 and "references[0]" in too_short.json()["message"]
        two = await tts(references=inline * 2)
        assert two.status_code == 400 and "one is supported" in two.json()["message"]
        not_audio = await tts(references=[{"audio": b"not audio at all", "text": "Hi."}])
        assert not_audio.status_code == 415, not_audio.text


def test_both_fish_sdks_speak_with_a_stored_voice_and_an_inline_one(
    tmp_path: Path, reference_wav: bytes
) -> None:
    """``fishaudio`` and the legacy ``fish_audio_sdk``, unmodified: a stored voice as
    ``reference_id`` over HTTP and the live socket, and an inline reference."""
    engine, settings = fish(tmp_path / "voices")
    with serve_app_in_thread(engine, settings) as app:
        files = {"audio": ("me.wav", reference_wav, "audio/wav")}
        data = {"text": TRANSCRIPT, "id": "mine"}
        assert httpx.post(app.url + "/v1/voices", data=data, files=files).status_code == 201
        client = FishAudio(api_key="unused", base_url=app.url)
        try:
            assert len(client.tts.convert(text="Hello.", reference_id="mine", format="pcm")) > 0
            inline = [ReferenceAudio(audio=reference_wav, text=TRANSCRIPT)]
            assert len(client.tts.convert(text="Hello.", references=inline, format="pcm")) > 0
            live = client.tts.stream_websocket(iter(["Hello ", "there."]), reference_id="mine")
            assert len(b"".join(live)) > 0
            with pytest.raises(APIError) as unknown:
                client.tts.convert(text="Hello.", reference_id="nobody")
            assert unknown.value.status == 400
        finally:
            client.close()
        session = fish_audio_sdk.Session("unused", base_url=app.url)
        request = fish_audio_sdk.TTSRequest(text="Hello.", reference_id="mine", format="pcm")
        assert len(b"".join(session.tts(request))) > 0
