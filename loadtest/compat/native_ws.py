"""The native protocol (``/v1/stream``) with the same LLM-like token stream, as a reference for
the compatibility clients' figures (same machine, same run): plain ``websockets``.

    python -m loadtest.compat.native_ws --url wss://127.0.0.1:8443
"""

from __future__ import annotations

import argparse
import asyncio
import json

from websockets.asyncio.client import connect

from loadtest.compat import ANSWER, emit, tokens


async def run(args: argparse.Namespace) -> None:
    fmt = {"encoding": "pcm_s16le", "sample_rate": args.sample_rate}
    async with connect(args.url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "context": "c", "format": fmt}))
        await ws.recv()  # started

        async def push() -> None:
            for token in tokens(args.text):
                await ws.send(json.dumps({"type": "text", "context": "c", "text": token}))
                emit("text", text=token)
                await asyncio.sleep(args.token_delay_s)
            await ws.send(json.dumps({"type": "end", "context": "c"}))
            emit("text_end")

        pusher = asyncio.create_task(push())
        audio_bytes = 0
        while True:
            frame = await ws.recv()
            if isinstance(frame, bytes):
                audio_bytes += len(frame) - 1 - frame[0]
                emit("audio", bytes=len(frame) - 1 - frame[0])
            elif json.loads(frame)["type"] == "done":
                break
        await pusher
    emit("result", audio_bytes=audio_bytes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="ws:// or wss:// base URL")
    parser.add_argument("--sample-rate", type=int, default=16000)
    parser.add_argument("--text", default=ANSWER)
    parser.add_argument("--token-delay-s", type=float, default=0.03)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
