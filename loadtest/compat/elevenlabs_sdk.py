"""The ``elevenlabs`` SDK's ``convert_realtime`` (stream-input), unmodified: LLM-like tokens in,
audio out. The SDK always connects with wss://: give it the server's https:// base URL and trust
the server's certificate with ``SSL_CERT_FILE``.

    python -m loadtest.compat.elevenlabs_sdk --base-url https://127.0.0.1:8443 [--format pcm_16000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

from elevenlabs.client import ElevenLabs

from loadtest.compat import ANSWER, emit, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--voice", default="default")
    parser.add_argument("--format", default=None, help="output_format (default: the SDK's)")
    parser.add_argument("--text", default=ANSWER)
    parser.add_argument("--token-delay-s", type=float, default=0.05)
    parser.add_argument("--out", default=None, help="write the audio to this file")
    args = parser.parse_args()

    client = ElevenLabs(api_key=args.api_key, base_url=args.base_url)

    def text() -> Iterator[str]:
        for token in tokens(args.text):
            emit("text", text=token)
            yield token
            time.sleep(args.token_delay_s)
        emit("text_end")

    kwargs = {} if args.format is None else {"output_format": args.format}
    audio = bytearray()
    for chunk in client.text_to_speech.convert_realtime(
        voice_id=args.voice, text=text(), model_id="eleven_flash_v2_5", **kwargs
    ):
        emit("audio", bytes=len(chunk))
        audio += chunk
    if args.out is not None:
        with open(args.out, "wb") as out:
            out.write(audio)
    emit("result", audio_bytes=len(audio))


if __name__ == "__main__":
    main()
