"""Load test over the native WebSocket: N concurrent realistic clients per level.

    python -m loadtest [--url http://127.0.0.1:8000 | --spawn --model synthetic:1.5]
                       [--levels 1 2 4 8] [--utterances 2] [--cadence-ms 40]
                       [--json loadtest.json] [--png loadtest.png]

Each client streams its text at LLM token cadence (1–6 characters every ``--cadence-ms``) and
plays the audio on a virtual clock (see ``loadtest.clients``). Per level it prints TTFA p50/p95/
p99 (client side: from sending the token that completes the first sentence to the first audio
frame), underruns, the smallest real-time margin (audio buffered ahead of playback) and
errors; then writes JSON and a PNG chart. Only loopback servers are accepted; every run is
bounded by the number of utterances and a receive timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from loadtest.clients import ClientResult, run_client
from loadtest.spawn import add_target_arguments, target_server

TEXTS = [
    "Sure, I can help with that. The train to the city leaves at half past nine, and the trip "
    "takes about forty minutes. Would you like me to book a seat for you?",
    "Here is a quick summary of today. It will be sunny in the morning, with clouds rolling in "
    "after lunch. Take a light jacket if you are going out this evening.",
    "Okay, I have set a timer for ten minutes. I will let you know when it is done. Is there "
    "anything else you would like me to do while you wait?",
]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[index], 1)


async def run_level(
    ws_url: str, clients: int, utterances: int, cadence_s: float, seed: int
) -> dict[str, Any]:
    texts = [TEXTS[i % len(TEXTS)] for i in range(utterances)]
    started_s = time.perf_counter()
    results: list[ClientResult] = await asyncio.gather(
        *(run_client(ws_url, c, texts, cadence_s, seed) for c in range(clients))
    )
    wall_s = time.perf_counter() - started_s
    utts = [u for r in results for u in r.utterances]
    ttfa = [u.ttfa_ms for u in utts if u.ttfa_ms is not None]
    leads = [u.min_lead_ms for u in utts if u.min_lead_ms is not None]
    return {
        "clients": clients,
        "utterances": len(utts),
        "ttfa_ms_p50": percentile(ttfa, 50),
        "ttfa_ms_p95": percentile(ttfa, 95),
        "ttfa_ms_p99": percentile(ttfa, 99),
        "server_ttfa_ms_p50": percentile(
            [u.server_ttfa_ms for u in utts if u.server_ttfa_ms is not None], 50
        ),
        "underruns": sum(u.underruns for u in utts),
        "streams_with_underruns": sum(1 for u in utts if u.underruns),
        "min_margin_ms": round(min(leads), 1) if leads else None,
        "median_margin_ms": round(statistics.median(leads), 1) if leads else None,
        "errors": sum(1 for u in utts if u.error),
        "audio_s": round(sum(u.audio_s for u in utts), 1),
        "wall_s": round(wall_s, 1),
    }


COLUMNS = [
    ("clients", "clients"),
    ("ttfa_ms_p50", "TTFA p50"),
    ("ttfa_ms_p95", "p95"),
    ("ttfa_ms_p99", "p99"),
    ("underruns", "underruns"),
    ("min_margin_ms", "min margin ms"),
    ("errors", "errors"),
    ("audio_s", "audio s"),
    ("wall_s", "wall s"),
]


def table(rows: list[dict[str, Any]]) -> str:
    header = " | ".join(title for _, title in COLUMNS)
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(" | ".join(f"{row[key]!s:>{len(title)}}" for key, title in COLUMNS))
    return "\n".join(lines)


def chart(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = [r["clients"] for r in rows]
    fig, (ax_ttfa, ax_under) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("ttfa_ms_p50", "p50"), ("ttfa_ms_p95", "p95"), ("ttfa_ms_p99", "p99")):
        ax_ttfa.plot(clients, [r[key] for r in rows], marker="o", label=label)
    ax_ttfa.set_xlabel("concurrent clients")
    ax_ttfa.set_ylabel("time to first audio (ms)")
    ax_ttfa.legend()
    ax_ttfa.grid(alpha=0.3)
    ax_under.bar([str(c) for c in clients], [r["streams_with_underruns"] for r in rows])
    ax_under.set_xlabel("concurrent clients")
    ax_under.set_ylabel("utterances with underruns")
    ax_under.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def run(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    ws_url = url.replace("http://", "ws://").rstrip("/") + "/v1/stream"
    rows = []
    for level in args.levels:
        print(f"level: {level} client(s) ...", file=sys.stderr, flush=True)
        row = await run_level(ws_url, level, args.utterances, args.cadence_ms / 1000, args.seed)
        print(f"  {row}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_arguments(parser)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--utterances", type=int, default=2, help="per client")
    parser.add_argument("--cadence-ms", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="loadtest.json")
    parser.add_argument("--png", default="loadtest.png", help='chart; "" for none')
    args = parser.parse_args(argv)
    with target_server(args, parser) as url:
        rows = asyncio.run(run(url, args))
    print(table(rows))
    result = {"url": url, "model": args.model if args.spawn else None, "levels": rows}
    with open(args.json, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2)
    if args.png:
        chart(rows, args.png, f"streamtts load test ({args.model if args.spawn else url})")
    print(f"wrote {args.json}" + (f" and {args.png}" if args.png else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
