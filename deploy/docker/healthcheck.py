"""The image's HEALTHCHECK: exit 0 while ``GET /healthz`` on this container answers 200."""

import os
import sys
import urllib.request

PORT = os.environ.get("STREAMTTS_PORT", "8000")

try:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/healthz", timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:  # refused, timed out, or an HTTP error status (503: an engine thread died)
    sys.exit(1)
