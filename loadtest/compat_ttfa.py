"""Time to first audio through each real client (the ElevenLabs SDK, Pipecat's ElevenLabs and
Cartesia services, LiveKit's ElevenLabs plugin, the Cartesia SDK), unmodified, from
``.venv-clients`` (``scripts/install-clients``).

    python -m loadtest.compat_ttfa [--runs 5] [--model piper] [--json]

Starts ``streamtts serve`` over TLS on a free loopback port (a self-signed certificate for
127.0.0.1 that the clients trust through ``SSL_CERT_FILE``; the ElevenLabs SDK only connects with
wss://), then runs each client ``--runs`` times, one utterance each: an LLM-like answer sent as
word tokens back to back. TTFA is the time from the client sending the first token to the first
audio the client hands to its caller, both on the client's clock (the socket is already open for
Pipecat, which connects at pipeline start; the ElevenLabs SDK and LiveKit connect when their text
starts, so their TTFA includes the TLS handshake). Prints the median, min and max per client,
with the native protocol's figure for the same tokens in the same run as a reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest.compat import ClientError, run_client_sync
from loadtest.tls import self_signed

Args = Callable[[str], list[str]]

# client name -> (script, arguments given the server's https:// URL, the protocol)
CLIENTS: dict[str, tuple[str, Args, str]] = {
    "native (reference): websockets": (
        "native_ws",
        lambda url: ["--url", url.replace("https", "wss", 1)],
        "/v1/stream",
    ),
    "elevenlabs SDK convert_realtime": (
        "elevenlabs_sdk",
        lambda url: ["--base-url", url, "--format", "pcm_16000"],
        "stream-input",
    ),
    "Pipecat ElevenLabsTTSService": (
        "pipecat_tts",
        lambda url: (
            ["--service", "elevenlabs", "--url", url.replace("https", "wss", 1)] + ["--turns", "1"]
        ),
        "multi-stream-input",
    ),
    "LiveKit elevenlabs.TTS stream": (
        "livekit_elevenlabs",
        lambda url: ["--base-url", url + "/v1"],
        "multi-stream-input",
    ),
    "cartesia SDK (sync)": (
        "cartesia_sdk",
        lambda url: ["--base-url", url, "--encoding", "pcm_s16le", "--sample-rate", "24000"],
        "/tts/websocket",
    ),
    "Pipecat CartesiaTTSService": (
        "pipecat_tts",
        lambda url: (
            ["--service", "cartesia", "--turns", "1"]
            + ["--url", url.replace("https", "wss", 1) + "/tts/websocket"]
        ),
        "/tts/websocket",
    ),
}


def ttfa_ms(events: list[dict[str, Any]]) -> float:
    """First token sent → first audio out of the client (its first utterance)."""
    first_text = float(next(e["t"] for e in events if e["event"] == "text"))
    first_audio = float(
        next(
            e["t"]
            for e in events
            if e["event"] in ("audio", "chunk") and e.get("reader", "first") == "first"
        )
    )
    return 1000.0 * (first_audio - first_text)


def measure(url: str, cert: Path, runs: int) -> dict[str, list[float]]:
    env = {"SSL_CERT_FILE": str(cert)}
    results: dict[str, list[float]] = {}
    for name, (script, args, _) in CLIENTS.items():
        figures = []
        for _ in range(runs):
            events = run_client_sync(script, [*args(url), "--token-delay-s", "0"], env=env)
            figures.append(ttfa_ms(events))
        results[name] = figures
        print(f"  {name}: {', '.join(f'{v:.0f}' for v in figures)} ms", file=sys.stderr)
    return results


def main() -> int:
    from loadtest.spawn import SpawnedServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", default="piper")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cert = self_signed(Path(tmp))
        server = SpawnedServer(args.model, certfile=cert.certfile, keyfile=cert.keyfile)
        try:
            results = measure(server.url, cert.certfile, args.runs)
        except ClientError as exc:
            print(exc, file=sys.stderr)
            return 1
        finally:
            server.stop()
    summary = {
        name: {
            "protocol": CLIENTS[name][2],
            "median_ms": round(statistics.median(v), 1),
            "min_ms": round(min(v), 1),
            "max_ms": round(max(v), 1),
            "runs": len(v),
        }
        for name, v in results.items()
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{'client':<34} {'protocol':<20} {'median':>8} {'min':>6} {'max':>6}")
    for name, row in summary.items():
        print(
            f"{name:<34} {row['protocol']:<20} {row['median_ms']:>6.0f}ms "
            f"{row['min_ms']:>4.0f}ms {row['max_ms']:>4.0f}ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
