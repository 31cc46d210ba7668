"""Load and latency measurements against a running streamtts server (loopback only)."""

from __future__ import annotations

import json
from typing import Any


def print_result(result: Any, path: str | None) -> None:
    """A measurement's figures as JSON on stdout, and also in ``path`` when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text + "\n")
