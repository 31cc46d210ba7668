"""How long the caches the server writes beside itself keep what nobody uses (no I/O here).

Both caches are keyed by everything their content depends on (code, libraries, CPU), so every
upgrade makes new keys: the Piper calibration cache (:mod:`streamtts.piper.calibration_cache`)
and the fused ops' library builds (:mod:`streamtts.models.fish.fused.library`) each remove what
has gone unused this long, and what a writer left half-made this long ago.
"""

from __future__ import annotations

UNUSED_FOR_S = 30 * 24 * 3600.0  # an entry no start has used for a month goes
ABANDONED_AFTER_S = 3600.0  # a partial entry or build folder is another writer's until this old
