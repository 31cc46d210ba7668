"""The ``cartesia`` SDK's TTS WebSocket (``tts.websocket_connect()``), sync or async, unmodified:
three contexts on one socket — LLM-like tokens pushed while audio is read, then one cancelled
after its first chunk, then one more — every response recorded with the context that read it.

    python -m loadtest.compat.cartesia_sdk --websocket-base-url ws://127.0.0.1:8000 [--mode async]
    python -m loadtest.compat.cartesia_sdk --base-url https://127.0.0.1:8443   (wss://, TLS)
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

from cartesia import AsyncCartesia, Cartesia

from loadtest.compat import ANSWER, emit, tokens

SECOND = (
    "This context is cancelled as soon as its first audio arrives, so most of it is never spoken."
)
THIRD = "The socket is still open, and this context is spoken in full."


def record(reader: str, response: Any) -> None:
    audio = getattr(response, "audio", None) if response.type == "chunk" else None
    emit(
        response.type,
        reader=reader,
        context=getattr(response, "context_id", None),
        bytes=len(audio or b""),
        flush_id=getattr(response, "flush_id", None),
        message=getattr(response, "message", None),
    )


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"api_key": args.api_key}
    if args.websocket_base_url:
        kwargs["websocket_base_url"] = args.websocket_base_url
    if args.base_url:
        kwargs["base_url"] = args.base_url
    return kwargs


def context_options(args: argparse.Namespace) -> dict[str, Any]:
    fmt = {"container": "raw", "encoding": args.encoding, "sample_rate": args.sample_rate}
    return {"model_id": "sonic-latest", "voice": args.voice, "output_format": fmt}


def run_sync(args: argparse.Namespace) -> None:
    client = Cartesia(**client_kwargs(args))
    with client.tts.websocket_connect() as connection:
        first = connection.context(context_id="first", **context_options(args))

        def push() -> None:
            for token in tokens(args.text):
                first.push(token)
                emit("text", reader="first", text=token)
                time.sleep(args.token_delay_s)
            first.no_more_inputs()
            emit("text_end", reader="first")

        pusher = threading.Thread(target=push)
        pusher.start()
        for response in first.receive():
            record("first", response)
        pusher.join()

        second = connection.context(context_id="second", **context_options(args))
        second.push(SECOND)
        for response in second.receive():
            record("second", response)
            if response.type == "chunk":
                break
        second.cancel()
        emit("cancel", reader="second")

        third = connection.context(context_id="third", **context_options(args))
        third.push(THIRD)
        third.no_more_inputs()
        for response in third.receive():
            record("third", response)
    emit("result")


async def run_async(args: argparse.Namespace) -> None:
    client = AsyncCartesia(**client_kwargs(args))
    async with client.tts.websocket_connect() as connection:
        first = connection.context(context_id="first", **context_options(args))

        async def push() -> None:
            for token in tokens(args.text):
                await first.push(token)
                emit("text", reader="first", text=token)
                await asyncio.sleep(args.token_delay_s)
            await first.no_more_inputs()
            emit("text_end", reader="first")

        pusher = asyncio.create_task(push())
        async for response in first.receive():
            record("first", response)
        await pusher

        second = connection.context(context_id="second", **context_options(args))
        await second.push(SECOND)
        async for response in second.receive():
            record("second", response)
            if response.type == "chunk":
                break
        await second.cancel()
        emit("cancel", reader="second")

        third = connection.context(context_id="third", **context_options(args))
        await third.push(THIRD)
        await third.no_more_inputs()
        async for response in third.receive():
            record("third", response)
    emit("result")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--websocket-base-url", default=None)
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--voice", default="default")
    parser.add_argument("--encoding", default="pcm_f32le")
    parser.add_argument("--sample-rate", type=int, default=44100)
    parser.add_argument("--text", default=ANSWER)
    parser.add_argument("--token-delay-s", type=float, default=0.03)
    args = parser.parse_args()
    if args.mode == "sync":
        run_sync(args)
    else:
        asyncio.run(run_async(args))


if __name__ == "__main__":
    main()
