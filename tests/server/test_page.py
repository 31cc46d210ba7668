"""The player page (``GET /``, ``static/``) in a real headless Chromium against a real server
(the bundled voice; a synthetic Fish server for cloned voices).

The page exposes ``window.streamttsStats`` (see ``static/app.js``); these tests drive the page
like a user (type, click, keys) and read that hook, the DOM, and the JSON frames the page sent.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from tests.audio_files import bundled_voice_speech, encode

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
SCREENSHOT = Path("/tmp/streamtts-page.png")

DONE_TIMEOUT_MS = 90_000  # a whole sentence on a shared 2-core CPU, with margin
FIRST_AUDIO_TIMEOUT_MS = 60_000
CANCEL_TIMEOUT_MS = 10_000  # `done` after `cancel`
QUIET_AFTER_DONE_MS = 1_500  # watch for stray audio this long after `done`
PLAYBACK_SLACK_MS = 15_000  # playback may start late and the audio clock may lag

SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank."  # 14 words
LONG_TEXT = " ".join(
    [
        "Once upon a time, in a small village by the sea, there lived an old fisherman.",
        "Every morning he rowed out past the harbour wall before the sun came up.",
        "He knew every rock, every current and every seabird by its call.",
        "One day the wind turned, the sky went dark, and the waves grew tall.",
        "He sang to himself the songs his mother taught him, and kept on rowing.",
        "By evening he was home again, tired, wet, and very happy to be alive.",
    ]
    * 3
)

# Records every JSON text frame the page sends, before app.js runs.
RECORD_SENT = """
window.__sentFrames = [];
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
  if (typeof data === "string") window.__sentFrames.push(JSON.parse(data));
  return send.call(this, data);
};
"""

DONE_FOR_CURRENT = (
    "() => { const s = window.streamttsStats;"
    " return s.lastDone !== null && s.context !== null && s.lastDone.context === s.context; }"
)
FIRST_AUDIO_ARRIVED = "() => window.streamttsStats.bytesReceived > 0"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000
        )
        try:
            yield browser
        finally:
            browser.close()


class PageUnderTest:
    def __init__(self, page: Page) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on("pageerror", lambda exc: self.problems.append(f"pageerror: {exc}"))
        page.on("console", self._on_console)

    def _on_console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.problems.append(f"console error: {msg.text}")

    def stats(self) -> dict[str, Any]:
        return self.page.evaluate("() => JSON.parse(JSON.stringify(window.streamttsStats))")

    def sent(self) -> list[dict[str, Any]]:
        return self.page.evaluate("() => window.__sentFrames")

    def wait(self, expression: str, timeout_ms: int) -> None:
        self.page.wait_for_function(expression, timeout=timeout_ms, polling=20)


@pytest.fixture
def player(browser: Browser, live_server: str) -> Iterator[PageUnderTest]:
    context = browser.new_context(viewport={"width": 1000, "height": 1200})
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        page.add_init_script(RECORD_SENT)
        under_test = PageUnderTest(page)
        page.goto(f"{live_server}/", wait_until="load")
        voices = fetch_json(f"{live_server}/v1/voices")
        # The voice list is loaded from the server and its default is selected.
        page.wait_for_function(
            "(id) => document.querySelector('#voice').value === id", arg=voices["default"]
        )
        yield under_test
    finally:
        context.close()


def fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def audio_seconds(stats: dict[str, Any]) -> float:
    return float(stats["bytesReceived"]) / 4 / float(stats["sampleRate"])


@pytest.mark.timeout(180)
def test_speak_streams_audio(player: PageUnderTest) -> None:
    page = player.page
    page.fill("#text", SENTENCE)
    page.click("#speak")
    player.wait(DONE_FOR_CURRENT, DONE_TIMEOUT_MS)
    page.wait_for_timeout(300)  # let late frames, if any, show up
    stats = player.stats()

    done = stats["lastDone"]
    assert done["reason"] == "end", done
    assert stats["state"] == "done"
    assert stats["errors"] == []
    assert stats["lateBytes"] == 0, "audio arrived after `done`"

    # What the page asked for.
    start = next(f for f in player.sent() if f["type"] == "start")
    sample_rate = start["format"]["sample_rate"]
    assert start["format"]["encoding"] == "pcm_f32le"
    assert 8000 <= sample_rate <= 48000
    assert start["context"] == stats["context"]
    assert stats["sampleRate"] == sample_rate  # the server's `started` agreed

    # What came back: float32 samples, a plausible length, measured first audio.
    assert stats["bytesReceived"] > 0
    assert stats["bytesReceived"] % 4 == 0
    seconds = audio_seconds(stats)
    assert 1.0 < seconds < 30.0, seconds
    assert isinstance(stats["firstAudioMs"], (int, float))
    assert 0 < stats["firstAudioMs"] < DONE_TIMEOUT_MS
    server = done["stats"]
    assert server["ttfa_ms"] > 0
    assert server["rtf"] > 0
    assert abs(server["audio_ms"] / 1000 - seconds) < 0.1 * seconds + 0.1, (server, seconds)

    # The worklet plays all of it, sample for sample (the ring buffer loses and repeats nothing).
    player.wait(
        "() => { const s = window.streamttsStats; return s.playedMs >= s.audioMs - 2; }",
        int(seconds * 1000) + PLAYBACK_SLACK_MS,
    )
    played = player.stats()
    assert abs(played["playedMs"] - played["audioMs"]) <= 2, played
    assert isinstance(played["underruns"], int) and played["underruns"] >= 0
    assert page.text_content("#stat-underruns") == str(played["underruns"])

    # What the page shows.
    assert page.text_content("#stat-ttfa").endswith(" ms")  # type: ignore[union-attr]
    assert page.text_content("#stat-server-ttfa").endswith(" ms")  # type: ignore[union-attr]
    assert page.text_content("#stat-rtf") != "–"
    assert page.text_content("#stat-state") == "done"
    captions = page.text_content("#captions") or ""
    assert "fox" in captions and "river" in captions, captions

    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert player.problems == []


@pytest.mark.timeout(180)
def test_stop_barges_in(player: PageUnderTest) -> None:
    page = player.page
    page.fill("#text", LONG_TEXT)
    page.click("#speak")
    player.wait(FIRST_AUDIO_ARRIVED, FIRST_AUDIO_TIMEOUT_MS)
    page.click("#stop")
    at_stop = player.stats()
    # On loopback the server's `done` can arrive before the page is read back.
    assert at_stop["state"] in ("cancelling", "cancelled"), at_stop["state"]
    if at_stop["lastDone"] is not None:
        assert at_stop["lastDone"]["reason"] == "cancel", "the long text ended before Stop"

    player.wait(DONE_FOR_CURRENT, CANCEL_TIMEOUT_MS)
    page.wait_for_timeout(QUIET_AFTER_DONE_MS)
    stats = player.stats()
    assert stats["lastDone"]["reason"] == "cancel", stats["lastDone"]
    assert stats["state"] == "cancelled"
    assert stats["bytesReceived"] == at_stop["bytesReceived"] > 0
    assert stats["lateBytes"] == 0, "audio arrived after `done`"
    assert stats["errors"] == []
    assert page.is_disabled("#stop")

    frames = player.sent()
    assert [f["type"] for f in frames] == ["start", "text", "end", "cancel"]
    assert frames[-1]["context"] == stats["context"]
    assert player.problems == []


@pytest.mark.timeout(180)
def test_keyboard_and_simulated_token_stream(player: PageUnderTest) -> None:
    page = player.page
    page.fill("#text", SENTENCE)
    page.focus("#simulate")
    page.keyboard.press("Space")
    assert page.is_checked("#simulate")
    page.focus("#text")
    page.keyboard.press("Control+Enter")
    player.wait(DONE_FOR_CURRENT, DONE_TIMEOUT_MS)
    stats = player.stats()
    assert stats["lastDone"]["reason"] == "end", stats["lastDone"]
    assert audio_seconds(stats) > 1.0
    assert stats["firstAudioMs"] > 0

    # The text went out as many small pieces, in order, then `end`.
    frames = [f for f in player.sent() if f.get("context") == stats["context"]]
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "start" and kinds[-1] == "end"
    pieces = [f["text"] for f in frames if f["type"] == "text"]
    assert len(pieces) >= len(SENTENCE) // 8
    assert max(len(p) for p in pieces) <= 8
    assert "".join(pieces) == SENTENCE

    # Escape barges in from anywhere on the page.
    page.fill("#text", LONG_TEXT)
    page.focus("#text")
    page.keyboard.press("Control+Enter")
    player.wait(FIRST_AUDIO_ARRIVED, FIRST_AUDIO_TIMEOUT_MS)
    page.keyboard.press("Escape")
    player.wait(DONE_FOR_CURRENT, CANCEL_TIMEOUT_MS)
    assert player.stats()["lastDone"]["reason"] == "cancel"
    assert player.problems == []


VOICE_TRANSCRIPT = "This recording gives the model a voice to speak in, a few seconds long."


@pytest.mark.timeout(240)
def test_add_speak_with_and_delete_a_voice(
    browser: Browser, live_fish_server: str, tmp_path: Path
) -> None:
    # Playwright's sync API runs an event loop on this thread: make the speech on another.
    with ThreadPoolExecutor(1) as pool:
        samples, rate = pool.submit(asyncio.run, bundled_voice_speech(VOICE_TRANSCRIPT)).result()
    recording = tmp_path / "my-voice.wav"
    recording.write_bytes(encode(samples, rate, "wav"))
    context = browser.new_context(viewport={"width": 1000, "height": 1400})
    context.set_default_timeout(30_000)
    try:
        page = context.new_page()
        page.add_init_script(RECORD_SENT)
        player = PageUnderTest(page)
        page.goto(f"{live_fish_server}/", wait_until="load")
        page.wait_for_function("() => document.querySelector('#voice').options.length >= 1")
        assert page.locator("#voice-list li").count() == 0

        page.set_input_files("#voice-audio", str(recording))
        page.fill("#voice-text", VOICE_TRANSCRIPT)
        page.fill("#voice-name", "Page voice")
        page.click("#voice-add")
        page.wait_for_function(
            "() => document.querySelector('#voice-status').textContent.startsWith('Added')"
        )
        item = page.locator("#voice-list li")
        assert item.count() == 1
        voice_id = item.get_attribute("data-voice")
        assert voice_id and voice_id.startswith("page-voice-")
        assert page.eval_on_selector("#voice", "s => s.value") == voice_id  # selected

        page.fill("#text", "Hello in my new voice.")
        page.click("#speak")
        player.wait(DONE_FOR_CURRENT, DONE_TIMEOUT_MS)
        stats = player.stats()
        assert stats["lastDone"]["reason"] == "end" and stats["bytesReceived"] > 0
        starts = [m for m in player.sent() if m["type"] == "start"]
        assert starts[-1]["voice"] == voice_id

        page.click(f"#voice-list li[data-voice='{voice_id}'] button")
        page.wait_for_function("() => document.querySelectorAll('#voice-list li').length === 0")
        options = page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
        assert voice_id not in options
        assert player.problems == []
    finally:
        context.close()
