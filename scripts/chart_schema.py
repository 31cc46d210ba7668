"""Write the ``settings`` part of the Helm chart's values.schema.json from ``Settings``.

The chart passes ``settings: {NAME: value}`` to the server as ``STREAMTTS_NAME``; its schema
lists every server setting with its JSON type, so a misspelt name or a wrong type fails at
render. Settings the chart sets from its own values are left out. Run it after adding a setting:

    .venv/bin/python scripts/chart_schema.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from streamtts.config import Settings, leaves

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "deploy/helm/streamtts/values.schema.json"
# Set by the chart from its own values (model, shutdown, auth, allowedOrigins, the port,
# wyoming, tls).
CHART_MANAGED = frozenset(
    {
        "HOST",
        "PORT",
        "MODEL",
        "SHUTDOWN_GRACE_S",
        "API_KEYS",
        "API_KEY_FILE",
        "ALLOWED_ORIGINS",
        "WYOMING_PORT",
        "WYOMING_HOST",
        "WYOMING_ZEROCONF",
        "SSL_CERTFILE",
        "SSL_KEYFILE",
    }
)
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def settings_schema() -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name, default in leaves(Settings()):
        key = name.upper()
        if key in CHART_MANAGED:
            continue
        kind = JSON_TYPES[type(default)]
        entry: dict[str, Any] = {"type": kind, "default": default}
        if kind in ("integer", "number"):
            entry["minimum"] = 0
        properties[key] = entry
    return {
        "description": "Server settings by name without the STREAMTTS_ prefix "
        "(docs/operations.md); generated from streamtts/config.py by scripts/chart_schema.py.",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    schema = json.loads(SCHEMA_PATH.read_text())
    schema["properties"]["settings"] = settings_schema()
    SCHEMA_PATH.write_text(render(schema))
    print(f"{SCHEMA_PATH}: {len(schema['properties']['settings']['properties'])} settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
