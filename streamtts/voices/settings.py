"""Settings of the voice library (stored cloned voices)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from streamtts.bounds import SettingsError, require_bounds


@dataclass(frozen=True)
class VoiceSettings:
    # Where streamtts keeps its data; "": $XDG_DATA_HOME/streamtts, else ~/.local/share/streamtts.
    data_dir: str = ""
    # The voice library (several replicas may share it); "": <data_dir>/voices.
    voices_dir: str = ""
    max_voices: int = 100  # stored voices; beyond it an upload is refused (409 too_many_voices)
    max_voice_upload_bytes: int = 20 << 20  # one upload's body; beyond it 413
    min_reference_s: float = 2.0  # reference audio shorter than this: 400 audio_too_short
    max_reference_s: float = 30.0  # longer (stopped while decoding): 400 audio_too_long
    voices_rescan_s: float = 10.0  # how often the library looks for voices other replicas added

    def __post_init__(self) -> None:
        require_bounds(self, max_voice_upload_bytes=1, voices_rescan_s=0.1)
        if not 0 < self.min_reference_s <= self.max_reference_s:
            raise SettingsError("min_reference_s must be > 0 and <= max_reference_s")

    def library_dir(self) -> Path:
        if self.voices_dir:
            return Path(self.voices_dir).expanduser()
        return data_dir(self.data_dir) / "voices"


def data_dir(configured: str) -> Path:
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "streamtts"
