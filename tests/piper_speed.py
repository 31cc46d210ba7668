"""What ``speed`` 2 does to the bundled Piper voice's durations, for every test that checks it."""

from __future__ import annotations

# Audio at speed 2 over audio at speed 1. Piper scales each phoneme's duration by 1/speed and
# then rounds it up to whole frames, and draws the durations at random (noise_w): for the
# tests' sentences the ratio is about 0.6, not 0.5 (0.60-0.64 in 12 runs of two sentences,
# 0.66 once in CI). Ignored, speed would give about 1; inverted, about 2.
SPEED_2_DURATION_RATIO = (0.35, 0.75)
