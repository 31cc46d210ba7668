"""LiveKit Agents' ElevenLabs plugin, unmodified: ``TTS(base_url=".../v1", http_session=...)``,
``stream()``, LLM-like tokens pushed, ``flush()`` and ``end_input()``; every
``SynthesizedAudio`` recorded. The plugin cuts sentences itself and sends each with ``flush``
(auto_mode); its stream ends at the first ``flush()``, so that comes once, at the end. No
LiveKit server is involved.

    python -m loadtest.compat.livekit_elevenlabs --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from livekit.agents import APIConnectOptions
from livekit.plugins import elevenlabs

from loadtest.compat import ANSWER, emit, tokens


async def run(args: argparse.Namespace) -> None:
    async with aiohttp.ClientSession() as session:
        tts = elevenlabs.TTS(
            api_key=args.api_key,
            voice_id=args.voice,
            model="eleven_turbo_v2_5",
            base_url=args.base_url,
            encoding=f"pcm_{args.sample_rate}",
            http_session=session,
        )
        stream = tts.stream(conn_options=APIConnectOptions(max_retry=0))

        async def push() -> None:
            for token in tokens(args.text):
                stream.push_text(token)
                emit("text", text=token)
                await asyncio.sleep(args.token_delay_s)
            stream.flush()
            stream.end_input()
            emit("text_end")

        pusher = asyncio.create_task(push())
        audio_bytes = 0
        async for event in stream:
            frame = event.frame
            audio_bytes += len(frame.data.tobytes())
            emit(
                "audio",
                bytes=len(frame.data.tobytes()),
                sample_rate=frame.sample_rate,
                final=event.is_final,
            )
        emit("done")
        await pusher
        await stream.aclose()
        await tts.aclose()
    emit("result", audio_bytes=audio_bytes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True, help="the server's URL and /v1")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--voice", default="default")
    parser.add_argument("--sample-rate", type=int, default=16000)
    parser.add_argument("--text", default=ANSWER)
    parser.add_argument("--token-delay-s", type=float, default=0.03)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
