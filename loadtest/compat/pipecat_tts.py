"""Pipecat's ``ElevenLabsTTSService`` (multi-stream-input) or ``CartesiaTTSService``, unmodified,
in a pipeline without a transport: ``[tts, recorder]`` in a ``PipelineWorker`` under a
``WorkerRunner``, fed an LLM's frames (``LLMFullResponseStartFrame``, ``LLMTextFrame`` tokens,
``LLMFullResponseEndFrame``) turn after turn on one socket. ``--interrupt N`` barges in on turn N
(``InterruptionFrame``) as soon as its first audio reaches the recorder, while its text is still
coming, and goes on with the next turn.

    python -m loadtest.compat.pipecat_tts --service elevenlabs --url ws://127.0.0.1:8000
    python -m loadtest.compat.pipecat_tts --service cartesia --url ws://127.0.0.1:8000/tts/websocket
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from loadtest.compat import ANSWER, emit, tokens

TURN_TIMEOUT_S = 60.0


class Recorder(FrameProcessor):
    """The pipeline's end: every TTS frame, stamped, per turn."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0
        self.first_audio: dict[int, asyncio.Event] = {}
        self.stopped: dict[int, asyncio.Event] = {}

    def expect(self, turn: int) -> None:
        self.turn = turn
        self.first_audio[turn] = asyncio.Event()
        self.stopped[turn] = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            emit(
                "audio",
                turn=self.turn,
                bytes=len(frame.audio),
                sample_rate=frame.sample_rate,
                context=frame.context_id,
            )
            self.first_audio[self.turn].set()
        elif isinstance(frame, TTSStartedFrame):
            emit("started", turn=self.turn, context=frame.context_id)
        elif isinstance(frame, TTSStoppedFrame):
            emit("stopped", turn=self.turn, context=frame.context_id)
            self.stopped[self.turn].set()
        elif isinstance(frame, ErrorFrame):
            emit("error", turn=self.turn, error=str(frame.error))
        await self.push_frame(frame, direction)


def make_service(args: argparse.Namespace) -> Any:
    if args.service == "elevenlabs":
        from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

        return ElevenLabsTTSService(
            api_key=args.api_key,
            url=args.url,
            sample_rate=args.sample_rate,
            settings=ElevenLabsTTSService.Settings(voice=args.voice, model="eleven_flash_v2_5"),
        )
    from pipecat.services.cartesia.tts import CartesiaTTSService

    return CartesiaTTSService(
        api_key=args.api_key,
        url=args.url,
        sample_rate=args.sample_rate,
        settings=CartesiaTTSService.Settings(voice=args.voice, model="sonic-3.6"),
    )


async def run(args: argparse.Namespace) -> None:
    recorder = Recorder()
    worker = PipelineWorker(
        Pipeline([make_service(args), recorder]),
        params=PipelineParams(audio_out_sample_rate=args.sample_rate),
        cancel_on_idle_timeout=False,
    )
    ready = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        ready.set()

    async def drive() -> None:
        await asyncio.wait_for(ready.wait(), TURN_TIMEOUT_S)
        for turn in range(args.turns):
            recorder.expect(turn)
            emit("turn", turn=turn)
            await worker.queue_frame(LLMFullResponseStartFrame())
            interrupt = turn == args.interrupt
            for token in tokens(args.text):
                if interrupt and recorder.first_audio[turn].is_set():
                    break  # the LLM's answer is cut off by the barge-in
                await worker.queue_frame(LLMTextFrame(token))
                emit("text", turn=turn, text=token)
                await asyncio.sleep(args.token_delay_s)
            if interrupt:
                await asyncio.wait_for(recorder.first_audio[turn].wait(), TURN_TIMEOUT_S)
                emit("interrupt", turn=turn)
                await worker.queue_frame(InterruptionFrame())
                await asyncio.sleep(args.settle_s)
                continue
            await worker.queue_frame(LLMFullResponseEndFrame())
            emit("text_end", turn=turn)
            await asyncio.wait_for(recorder.stopped[turn].wait(), TURN_TIMEOUT_S)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())
    emit("result")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--service", choices=["elevenlabs", "cartesia"], required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--voice", default="default")
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--interrupt", type=int, default=-1, help="barge in on this turn")
    parser.add_argument("--text", default=ANSWER)
    parser.add_argument("--token-delay-s", type=float, default=0.03)
    parser.add_argument("--settle-s", type=float, default=0.5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
