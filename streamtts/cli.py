"""Command line: ``streamtts serve`` and ``streamtts say``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

from streamtts import hugepages
from streamtts.config import Settings, SettingsError
from streamtts.engine.base import InvalidOptionError, UnknownVoiceError
from streamtts.engine.factory import ModelSpecError
from streamtts.fish.settings import DTYPES
from streamtts.options import OptionError


def main(argv: list[str] | None = None) -> int:
    hugepages.default_on()  # before anything imports torch
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.run(args)
    except (
        SettingsError,
        ModelSpecError,
        OptionError,
        InvalidOptionError,
        UnknownVoiceError,
    ) as exc:
        parser.error(str(exc))
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamtts", description="Real-time streaming text-to-speech server."
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the server (settings also from STREAMTTS_* env)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument(
        "--wyoming-port",
        type=int,
        help="serve Wyoming (Home Assistant) on this TCP port too, e.g. 10200 (default: off)",
    )
    serve.add_argument("--wyoming-host", help="Wyoming bind address (default: --host)")
    _add_model(serve)
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--ssl-certfile", help="PEM certificate: serve https:// and wss:// (TLS)")
    serve.add_argument("--ssl-keyfile", help="PEM private key of --ssl-certfile")
    serve.set_defaults(run=_serve)

    say = sub.add_parser("say", help="synthesise text to a WAV file")
    say.add_argument("text", help="the text to speak")
    say.add_argument("-o", "--output", type=Path, required=True, help="output .wav file")
    say.add_argument("--voice", default=None, help="voice id (default: the model's default)")
    say.add_argument("--speed", type=float, default=1.0)
    _add_model(say)
    say.set_defaults(run=_say)

    bench = sub.add_parser("bench", help="per-stage speed of a Fish model on this machine")
    bench.add_argument("--model", default="synthetic:1.5", help="default: synthetic:1.5")
    bench.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    # The speed bench's options default to None: BenchOptions holds their defaults.
    bench.add_argument("--dtype", choices=DTYPES, help="default: auto")
    bench.add_argument("--repeats", type=int, help="default: 5")
    bench.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step as the server does with STREAMTTS_COMPILE",
    )
    bench.add_argument(
        "--batches",
        type=int,
        nargs="+",
        metavar="B",
        help="batch sizes of the step stages (default: 1 4 16; 1 is always measured)",
    )
    bench.add_argument(
        "--first-chunk-frames",
        type=int,
        nargs="+",
        metavar="N",
        help="also time first audio with these first chunks (frames), in the same run",
    )
    bench.add_argument(
        "--profile",
        action="store_true",
        help="also profile the codebook pass op by op (torch.profiler): where its time goes",
    )
    bench.add_argument(
        "--fidelity",
        action="store_true",
        help="instead of speed: how far bf16, int8 and auto move the model's logits and "
        "greedy frames from fp32 (teacher-forced, the serving paths)",
    )
    bench.add_argument("--steps", type=int, help="--fidelity: frames compared (default: 48)")
    bench.add_argument("--json", action="store_true", help="print JSON only")
    bench.set_defaults(run=_bench)
    return parser


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="'piper' (bundled voice, default), 'piper:/path/voice.onnx', a Fish-Speech 1.5 "
        "checkpoint directory, or 'synthetic:tiny' / 'synthetic:1.5'",
    )


def _serve(args: argparse.Namespace) -> int:
    from streamtts.server.app import create_app
    from streamtts.server.auth import ApiKeys, install_log_redaction, warn_if_exposed
    from streamtts.server.shutdown import GracefulServer, Lifecycle
    from streamtts.server.uvicorn_config import uvicorn_config

    settings = Settings.from_env(
        host=args.host,
        port=args.port,
        model=args.model,
        log_level=args.log_level,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        wyoming_port=args.wyoming_port,
        wyoming_host=args.wyoming_host,
    )
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        keys = ApiKeys.from_settings(settings)
    except OSError as exc:
        raise SettingsError(f"cannot read the API key file: {exc}") from exc
    warn_if_exposed(settings.host, keys, logging.getLogger("streamtts.server"))
    if keys.enabled:
        logging.getLogger("streamtts.server").info("API keys: %d configured", len(keys))
    for path in (settings.ssl_certfile, settings.ssl_keyfile):
        if path and not Path(path).is_file():
            raise SettingsError(f"TLS file not found: {path}")
    app = create_app(settings)
    config = uvicorn_config(app, settings)
    install_log_redaction()

    def lifecycle() -> Lifecycle:
        found: Lifecycle = app.state.streamtts.lifecycle
        return found

    server = GracefulServer(config, lifecycle, settings.shutdown_grace_s)
    server.run()
    return lifecycle().exit_code


def _say(args: argparse.Namespace) -> int:
    from streamtts.offline import synthesize_to_wav

    settings = Settings.from_env(model=args.model)
    started_s = time.perf_counter()
    seconds = asyncio.run(
        synthesize_to_wav(settings, args.text, args.output, voice=args.voice, speed=args.speed)
    )
    elapsed_s = time.perf_counter() - started_s
    print(f"wrote {args.output} ({seconds:.2f} s of audio in {elapsed_s:.2f} s)", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from streamtts.bench import BenchOptions, run

    # Each mode's options are refused by the other, never accepted and ignored.
    speed_only = [
        f"--{name.replace('_', '-')}"
        for name in ("dtype", "repeats", "compile", "batches", "first_chunk_frames", "profile")
        if getattr(args, name) not in (None, False)
    ]
    if args.fidelity:
        from streamtts.fidelity import FidelityOptions, run_fidelity

        if speed_only:
            raise SettingsError(
                f"{', '.join(speed_only)}: not for --fidelity, which runs every precision with "
                "the engine's own settings"
            )
        device = "cpu" if args.device == "auto" else args.device
        fidelity = FidelityOptions(args.model, device)
        if args.steps is not None:
            fidelity = dataclasses.replace(fidelity, steps=args.steps)
        result = run_fidelity(fidelity)
        print(json.dumps(result, indent=2))
        return 0
    if args.steps is not None:
        raise SettingsError("--steps is an option of --fidelity")
    defaults = BenchOptions()
    options = BenchOptions(
        model=args.model,
        device=args.device,
        dtype=defaults.dtype if args.dtype is None else args.dtype,
        repeats=defaults.repeats if args.repeats is None else args.repeats,
        batches=defaults.batches if args.batches is None else tuple(sorted({1, *args.batches})),
        compile=args.compile,
        op_profile=args.profile,
        first_chunk_frames=tuple(args.first_chunk_frames or ()),
    )
    result = run(options)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    ops = result.pop("codebook_pass_profile", None)
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if ops is not None:
        print(f"\ncodebook pass under the profiler: {ops['wall_ms_profiled']} ms a pass, ops "
              f"{ops['ops_self_ms']} ms, outside ops {ops['outside_ops_ms']} ms")  # fmt: skip
        if "matrix_products_gb_s" in ops:
            print(f"weight products: {ops['matrix_products_ms']} ms, streaming the weights at "
                  f"{ops['matrix_products_gb_s']} GB/s "
                  f"({ops['matrix_products_bandwidth_fraction']} of the "
                  f"{ops['memory_bandwidth_gb_s']} GB/s measured just before)")  # fmt: skip
        print(f"{'op':<40} {'calls':>6} {'self_ms':>8} {'share':>6}")
        for op in ops["ops"]:
            print(f"{op['op']:<40} {op['calls']:>6} {op['self_ms']:>8} {op['share']:>6}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
