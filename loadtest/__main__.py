"""Load test over the native WebSocket: N concurrent realistic clients per level.

    python -m loadtest [--url http://127.0.0.1:8000 | --spawn --model synthetic:1.5]
                       [--levels 1 2 4 8 | --find-capacity [--max-clients 128]]
                       [--utterances 1] [--cadence-ms 30 60]
                       [--json loadtest.json] [--png loadtest.png]

The clients of a level start together. Each streams a paragraph of 3-4 sentences on its own
socket at LLM token cadence (1–6 characters, then a pause drawn from ``--cadence-ms``) and
plays the audio from its first byte on a virtual clock with no prebuffer (see
``loadtest.clients``). Per level it prints TTFA p50/p95/p99 (client side: from sending the
token that completes the first sentence to the first audio frame), underruns, the smallest
real-time margin (audio buffered ahead of playback), refusals (the server said ``overloaded``:
counted apart from failures, with how long a refusal took) and errors; then writes JSON and a
PNG chart.

``--find-capacity`` ramps the clients (doubling, then halving the step between the last level
without underruns and the first with underruns) and prints the largest number of streams
served with zero underruns and no refusal. Only loopback servers are accepted; every run is
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
    "takes about forty minutes. There is a quieter carriage at the back. Would you like me to "
    "book a seat for you?",
    "Here is a quick summary of today. It will be sunny in the morning, with clouds rolling in "
    "after lunch. The wind picks up near the coast. Take a light jacket if you are going out "
    "this evening.",
    "Okay, I have set a timer for ten minutes. I will let you know when it is done. The oven "
    "should be hot by then. Is there anything else you would like me to do while you wait?",
]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return round(ordered[index], 1)


async def run_level(
    ws_url: str, clients: int, utterances: int, cadence_s: tuple[float, float], seed: int
) -> dict[str, Any]:
    started_s = time.perf_counter()
    results: list[ClientResult] = await asyncio.gather(
        *(
            run_client(ws_url, c, [TEXTS[(c + i) % len(TEXTS)] for i in range(utterances)],
                       cadence_s, seed)
            for c in range(clients)
        )
    )  # fmt: skip
    wall_s = time.perf_counter() - started_s
    all_utts = [u for r in results for u in r.utterances]
    refused = [u for u in all_utts if u.refused]
    utts = [u for u in all_utts if not u.refused]
    ttfa = [u.ttfa_ms for u in utts if u.ttfa_ms is not None]
    leads = [u.min_lead_ms for u in utts if u.min_lead_ms is not None]
    refusal_ms = [u.refusal_ms for u in refused if u.refusal_ms is not None]
    return {
        "clients": clients,
        "utterances": len(utts),
        "refused": len(refused),
        "refusal_ms_max": round(max(refusal_ms), 1) if refusal_ms else None,
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
    ("streams_with_underruns", "streams underran"),
    ("refused", "refused"),
    ("refusal_ms_max", "refusal ms"),
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


def served_cleanly(row: dict[str, Any]) -> bool:
    return bool(row["underruns"] == 0 and row["refused"] == 0 and row["errors"] == 0)


async def run(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    ws_url = url.replace("http://", "ws://").rstrip("/") + "/v1/stream"
    cadence_s = (args.cadence_ms[0] / 1000, args.cadence_ms[-1] / 1000)
    rows: list[dict[str, Any]] = []

    async def level(clients: int) -> dict[str, Any]:
        print(f"level: {clients} client(s) ...", file=sys.stderr, flush=True)
        row = await run_level(ws_url, clients, args.utterances, cadence_s, args.seed)
        print(f"  {row}", file=sys.stderr, flush=True)
        rows.append(row)
        await asyncio.sleep(1.0)  # let the server settle between levels
        return row

    if not args.find_capacity:
        for clients in args.levels:
            await level(clients)
        return rows
    good, bad, clients = 0, None, 1
    while bad is None and clients <= args.max_clients:  # double until a level fails
        if served_cleanly(await level(clients)):
            good, clients = clients, clients * 2
        else:
            bad = clients
    while bad is not None and bad - good > 1:  # then halve the gap
        middle = (good + bad) // 2
        if served_cleanly(await level(middle)):
            good = middle
        else:
            bad = middle
    print(f"capacity: {good} concurrent streams with zero underruns", file=sys.stderr)
    return sorted(rows, key=lambda r: r["clients"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_target_arguments(parser)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--find-capacity",
        action="store_true",
        help="ramp the clients until underruns or refusals appear (ignores --levels)",
    )
    parser.add_argument("--max-clients", type=int, default=128, help="with --find-capacity")
    parser.add_argument("--utterances", type=int, default=1, help="paragraphs per client")
    parser.add_argument(
        "--cadence-ms",
        type=float,
        nargs="+",
        default=[30.0, 60.0],
        help="pause between tokens: a value, or a range drawn from per token",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="loadtest.json")
    parser.add_argument("--png", default="loadtest.png", help='chart; "" for none')
    args = parser.parse_args(argv)
    with target_server(args, parser) as url:
        rows = asyncio.run(run(url, args))
    print(table(rows))
    result: dict[str, Any] = {
        "url": url,
        "model": args.model if args.spawn else None,
        "levels": rows,
    }
    if args.find_capacity:
        clean = [r["clients"] for r in rows if served_cleanly(r)]
        result["capacity_streams"] = max(clean, default=0)
    with open(args.json, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2)
    if args.png:
        chart(rows, args.png, f"streamtts load test ({args.model if args.spawn else url})")
    print(f"wrote {args.json}" + (f" and {args.png}" if args.png else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
