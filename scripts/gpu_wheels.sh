#!/usr/bin/env bash
# Download (here, with PyPI) the wheels the GPU check needs that the device image lacks, into
# .whl/ (ignored by git), for the device tool's `carry`. The image has torch, numpy, tiktoken;
# the server and the load test need the rest (~35 MB; matplotlib is left out: the check writes
# the load test's JSON and the chart is drawn here from it).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "soxr==1.1.0" av starlette uvicorn h11 click \
    websockets orjson anyio sniffio idna typing_extensions prometheus_client
ls -la .whl
du -sh .whl
