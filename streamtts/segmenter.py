"""Incremental text segmentation: LLM token deltas in, speakable segments out.

Pure and I/O-free. A :class:`TextSegmenter` buffers text pushed in deltas of any granularity
(LLM tokens split words, numbers and abbreviations anywhere) and emits *segments* — the units
the TTS model synthesises one at a time — as soon as they are known to be complete:

- **Sentence ends**: ``. ! ? …`` (runs like ``?!`` or ``...``), optionally followed by closing
  quotes/brackets, then whitespace; CJK ``。！？`` (no space needed); line breaks.
- **Not sentence ends**: a period not yet followed by whitespace (``3.14``, ``$19.99``,
  ``U.S.``, ``example.com``); any terminator followed by whitespace and a lowercase letter
  (``etc. and``, ``Well... maybe``, ``"Hi!" she said``); a period after a title or reference
  abbreviation (``Dr. Smith``, ``Mr.``, ``Mrs.``, ``Ms.``, ``Prof.``, ``St.``, ``vs.``, …),
  after a single letter or dotted initials (``J. R. R. Tolkien``, ``U.S. Army``, ``e.g.``,
  ``i.e.``), after ``No.``/``Fig.``/``p.`` … before a number, and after a list number at the
  start of a segment (``1. Preheat``).
- **Clause boundaries** (``, ; : – -`` followed by whitespace, ``—``, CJK ``，、；：``) are used
  for the short first segment and to split sentences longer than ``max_segment_chars``.

Each decision looks only at a bounded window of text *after* the candidate boundary and is
deferred until that window has arrived (``push("3.")`` waits to see whether ``14`` or
``" The"`` follows). Hence **chunking invariance**: the segments do not depend on how the text
was split into deltas, only on the text (as long as no deadline fires: :meth:`TextSegmenter.poll`
and :meth:`TextSegmenter.flush` force decisions early).

Output normalisation: segments are stripped and every whitespace run inside them becomes one
space. A segment with no letter or digit (``"..."``, ``":)"``) is never sent to the model: it
is appended to the previous segment of the same call when there is one (and it fits), else
dropped. Cuts are only made after a letter or digit, so this can only happen at the very end of
a flush or a forced deadline cut: apart from such trailing punctuation, the concatenation of the
segments equals the input's non-whitespace text, in order.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Final

# --------------------------------------------------------------------------------------------
# Character classes
# --------------------------------------------------------------------------------------------

SENTENCE_TERMINATORS: Final = frozenset(".!?…‼⁇⁈⁉。！？｡")
"""Characters that can end a sentence (runs of them are taken together)."""
CJK_TERMINATORS: Final = frozenset("。！？｡")
"""Terminators that end a sentence without a following space."""
CLOSERS: Final = frozenset("\"'”’»)]}」』）】〉》*_")
"""Closing quotes/brackets (and Markdown emphasis) that may follow a terminator."""
CLAUSE_NEEDS_SPACE: Final = frozenset(",;:–")
"""Clause punctuation that is a boundary only when followed by whitespace (``3,000``,
``3:45`` and ``1–2`` are not)."""
CLAUSE_ALWAYS: Final = frozenset("—，、；：")
"""Clause punctuation that is always a boundary."""

TITLE_ABBREVIATIONS: Final = frozenset(
    {
        "mr", "mrs", "ms", "mx", "dr", "prof", "st", "sr", "jr", "mt", "ft", "vs", "gen", "col",
        "lt", "sgt", "capt", "cmdr", "gov", "sen", "rep", "rev", "hon", "fr", "pres", "supt",
        "approx", "cf", "al", "ca", "dept", "est", "viz",
    }
)  # fmt: skip
"""Lower-cased words whose trailing period never ends a sentence (followed by anything).
``etc.`` is not here: it often ends sentences, and before a lowercase word the general
lowercase rule keeps it inside the sentence anyway."""

NUMBER_ABBREVIATIONS: Final = frozenset(
    {"no", "nos", "nr", "fig", "figs", "p", "pp", "vol", "ch", "sec", "art", "op", "eq", "ref"}
)
"""Lower-cased words whose trailing period does not end a sentence when a digit follows."""

_INITIALS: Final = re.compile(r"[^\W\d_](?:\.[^\W\d_])*")
"""A single letter or dotted initials without the final period: ``J``, ``U.S``, ``e.g``."""
_LIST_NUMBER: Final = re.compile(r"\d{1,3}")


_WHITESPACE_RUN: Final = re.compile(r"\s+")
_LINE_BREAKS: Final = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _canonical_run(match: re.Match[str]) -> str:
    return "\n" if any(ch in _LINE_BREAKS for ch in match.group()) else " "


def _canonical_whitespace(text: str) -> str:
    """Every whitespace run → one ``"\\n"`` if it holds a line break, else one space."""
    return _WHITESPACE_RUN.sub(_canonical_run, text)


def _has_text(s: str) -> bool:
    return any(ch.isalnum() for ch in s)


def _normalise(s: str) -> str:
    return " ".join(s.split())


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmenterOptions:
    """Segmentation policy. Lengths count characters from a segment's first non-space
    character, with every whitespace run counted as one character (so they are independent of
    how the text was chunked)."""

    first_segment_min_chars: int = 20
    """The first segment (of the stream, and again after each flush or forced deadline cut)
    ends at the first sentence end of any length, or at the first clause boundary at or after
    this many characters, so speech starts early."""
    min_segment_chars: int = 10
    """Later segments end at a sentence end only once they are at least this long; shorter
    sentences are merged with the next (fewer, more natural model calls). 0 disables."""
    max_segment_chars: int = 250
    """Hard upper bound on a segment. A longer sentence is cut at its last clause boundary
    within the limit, else its last space, else (no spaces: CJK, URLs) at the limit."""
    max_buffer_delay_ms: float = 1500.0
    """Buffered text that is not yet a complete segment is emitted anyway (by :meth:`poll`)
    this long after its first character arrived, or after the previous forced emission."""

    def __post_init__(self) -> None:
        if self.max_segment_chars < 1:
            raise ValueError("max_segment_chars must be ≥ 1")
        if not 0 <= self.first_segment_min_chars <= self.max_segment_chars:
            raise ValueError("first_segment_min_chars must be in [0, max_segment_chars]")
        if not 0 <= self.min_segment_chars <= self.max_segment_chars:
            raise ValueError("min_segment_chars must be in [0, max_segment_chars]")
        if not self.max_buffer_delay_ms > 0:
            raise ValueError("max_buffer_delay_ms must be > 0")


# --------------------------------------------------------------------------------------------
# Boundary detection
# --------------------------------------------------------------------------------------------


class _Kind(Enum):
    SENTENCE = "sentence"  # sentence end (also a line break)
    CLAUSE = "clause"  # clause punctuation
    SPACE = "space"  # between words (the segment ends before the whitespace)


@dataclass(frozen=True, slots=True)
class _Boundary:
    end: int  # the segment would be buf[start:end]
    kind: _Kind


@dataclass(frozen=True, slots=True)
class _Undecided:
    end_min: int  # the undecided boundary would end at or after this index


def _boundaries(
    buf: str, start: int, final: bool, horizon: int | None = None
) -> Iterator[_Boundary | _Undecided]:
    """Candidate boundaries of ``buf[start:]`` in text order (non-decreasing ``end``).

    Stops with an :class:`_Undecided` when a decision needs text that has not arrived yet; with
    ``final`` the end of the buffer is the end of the text and everything is decided. Scanning
    also stops, with ``_Undecided(i)``, at the first character ``i > horizon`` (every later
    boundary ends beyond the horizon), which bounds the work per call.
    """
    n = len(buf)
    i = start
    while i < n:
        if horizon is not None and i > horizon:
            yield _Undecided(i)
            return
        ch = buf[i]
        if ch == "\n":
            yield _Boundary(i, _Kind.SENTENCE)
            i += 1
        elif ch.isspace():
            yield _Boundary(i, _Kind.SPACE)
            i += 1
        elif ch in SENTENCE_TERMINATORS:
            stop = n if horizon is None else min(n, horizon + 1)
            j = i
            while j < stop and buf[j] in SENTENCE_TERMINATORS:
                j += 1
            while j < stop and buf[j] in CLOSERS:
                j += 1
            if j > stop - 1 and stop < n:  # the run reaches past the horizon
                yield _Undecided(j)
                return
            decision = _is_sentence_end(buf, start, i, j, final)
            if decision is None:
                yield _Undecided(j)
                return
            if decision:
                yield _Boundary(j, _Kind.SENTENCE)
            i = j
        elif ch in CLAUSE_ALWAYS:
            yield _Boundary(i + 1, _Kind.CLAUSE)
            i += 1
        elif ch in CLAUSE_NEEDS_SPACE or (ch == "-" and i > start and buf[i - 1].isspace()):
            if i + 1 == n:
                if not final:
                    yield _Undecided(i + 1)
                return
            if buf[i + 1].isspace():
                yield _Boundary(i + 1, _Kind.CLAUSE)
            i += 1
        else:
            i += 1


def _is_sentence_end(buf: str, start: int, i: int, j: int, final: bool) -> bool | None:
    """Does the terminator run ``buf[i:j]`` (with its closers) end a sentence? ``None``: the
    text after it has not arrived yet."""
    n = len(buf)
    if j == n:
        return True if final else None
    run = buf[i:j]
    if any(ch in CJK_TERMINATORS for ch in run):
        return True
    if not buf[j].isspace():
        return False  # 3.14, U.S., example.com, ...and
    m = j
    while m < n and buf[m].isspace():
        if buf[m] == "\n":
            return True  # paragraph break
        m += 1
    if m == n:
        return True if final else None
    following = buf[m]
    if following.islower():
        return False  # etc. and / Well... maybe / "Hi!" she said
    if run.rstrip("".join(CLOSERS)) != ".":
        return True
    # A single period: abbreviations, initials, list numbers.
    word_start = i
    while word_start > start and not buf[word_start - 1].isspace():
        word_start -= 1
    word = buf[word_start:i].lstrip("\"'“‘«([{*_")
    lowered = word.lower()
    if lowered in TITLE_ABBREVIATIONS or _INITIALS.fullmatch(word):
        return False
    if following.isdigit() and lowered in NUMBER_ABBREVIATIONS:
        return False
    return not (_LIST_NUMBER.fullmatch(word) and buf[start:i].strip("*_#-• ") == word)


# --------------------------------------------------------------------------------------------
# The segmenter
# --------------------------------------------------------------------------------------------


class TextSegmenter:
    """Turns a stream of text deltas into speakable segments (see the module docstring).

    Times are caller-supplied milliseconds on any monotonic clock. Typical use::

        segments = seg.push(delta, now_ms)   # on every text message
        seg.deadline_ms()                    # when to call poll() next (None: nothing pending)
        segments = seg.poll(now_ms)          # at/after the deadline
        segments = seg.flush()               # explicit flush / end of text
    """

    def __init__(self, options: SegmenterOptions | None = None) -> None:
        self.options = options if options is not None else SegmenterOptions()
        self._buf = ""
        self._buf_offset = 0  # absolute text index of _buf[0]
        # (absolute text index where a push began, its time), oldest first
        self._arrivals: list[tuple[int, float]] = []
        self._first = True  # the next segment may be short (start of speech)
        self._forced_at_ms = float("-inf")

    # --- public API -------------------------------------------------------------------------

    def push(self, text: str, now_ms: float) -> list[str]:
        """Append a delta; returns the segments that are complete now."""
        # The buffer holds canonical whitespace (one char per run), merged across deltas, so
        # lengths are chunking-independent and a flood of whitespace costs nothing to rescan.
        canon = _canonical_whitespace(text)
        if canon and self._buf and self._buf[-1].isspace() and canon[0].isspace():
            joint = "\n" if "\n" in (self._buf[-1], canon[0]) else " "
            self._buf = self._buf[:-1] + joint
            canon = canon[1:]
        if canon:
            self._arrivals.append((self._buf_offset + len(self._buf), now_ms))
            self._buf += canon
        return self._cut_ready(final=False)

    def flush(self) -> list[str]:
        """Returns everything buffered as segments, now. The next segment counts as a first
        segment again (short, for a quick start)."""
        segments = self._cut_ready(final=True)
        self._consume(len(self._buf))
        self._first = True
        return segments

    def deadline_ms(self) -> float | None:
        """When buffered text must be emitted by :meth:`poll` even though it is not a complete
        segment: ``max_buffer_delay_ms`` after its first character arrived (or after the last
        forced emission, if later). ``None`` when nothing speakable is buffered."""
        start = self._content_start()
        if start is None:
            return None
        absolute = self._buf_offset + start
        idx = bisect.bisect_right(self._arrivals, absolute, key=lambda a: a[0]) - 1
        arrived_ms = self._arrivals[idx][1] if idx >= 0 else self._forced_at_ms
        return max(arrived_ms, self._forced_at_ms) + self.options.max_buffer_delay_ms

    def poll(self, now_ms: float) -> list[str]:
        """If the deadline has passed, emits buffered text: up to the last clause/sentence
        boundary when only a short tail (≤ ``first_segment_min_chars``) would remain, else up
        to the last word boundary, keeping an unfinished trailing word buffered when there is
        one. Returns ``[]`` before the deadline."""
        deadline = self.deadline_ms()
        if deadline is None or now_ms < deadline:
            return []
        cut = self._forced_cut()
        head, tail = self._buf[:cut], self._buf[cut:]
        offset = self._buf_offset
        arrivals = self._arrivals
        # Segment the head as if it were the whole text, then keep the tail buffered.
        self._buf = head
        segments = self._cut_ready(final=True)
        self._buf = tail
        self._buf_offset = offset + cut
        self._arrivals = arrivals
        self._consume(0)
        self._first = True
        self._forced_at_ms = now_ms
        return segments

    def reset(self) -> None:
        """Drop everything buffered (cancel); the next segment is a first segment again."""
        self._consume(len(self._buf))
        self._first = True
        self._forced_at_ms = float("-inf")

    def likely_next(self) -> str | None:
        """The segment :meth:`push` will return next if the text that follows confirms the
        sentence end that the buffered text ends with (an ordinary sentence coming next: a
        space, then a capital letter) — so that speech can start while that text is on its
        way. None when the buffer does not end with a sentence end, or ends with one that an
        ordinary sentence after it would not confirm (an abbreviation, an initial, a short
        sentence merged with the next), or with a period after a digit (``3.`` is more often
        ``3.14``) or an ellipsis. Chunking invariance is untouched: this only looks ahead."""
        text = self._buf.rstrip()
        run = text.rstrip("".join(CLOSERS))  # the text up to its terminators
        if run[-1:] not in SENTENCE_TERMINATORS:
            return None
        if run.endswith(".") and len(run) > 1 and run[-2].isdigit():
            return None
        if run.endswith(("..", "…")):
            return None  # a trailing-off more often goes on in lowercase ("Well... maybe")
        if self._cut_of(text + " A", final=False) != len(text):
            return None
        piece = _normalise(text)
        return piece if _has_text(piece) else None

    @property
    def buffered_text(self) -> str:
        """The text received but not emitted yet (each whitespace run as one space or line
        break; leading whitespace dropped)."""
        return self._buf

    # --- internals --------------------------------------------------------------------------

    def _content_start(self) -> int | None:
        for i, ch in enumerate(self._buf):
            if not ch.isspace():
                return i
        return None

    def _consume(self, k: int) -> None:
        """Drop ``_buf[:k]`` and any whitespace after it; prune arrival records."""
        rest = self._buf[k:]
        stripped = rest.lstrip()
        consumed = k + len(rest) - len(stripped)
        self._buf = stripped
        self._buf_offset += consumed
        # Keep the last arrival at or before the new start (it covers _buf[0]).
        idx = bisect.bisect_right(self._arrivals, self._buf_offset, key=lambda a: a[0]) - 1
        if idx > 0:
            del self._arrivals[:idx]

    def _cut_ready(self, final: bool) -> list[str]:
        segments: list[str] = []
        while True:
            self._consume(0)
            if not self._buf:
                break
            cut = self._next_cut(final)
            if cut is None:
                break
            piece = _normalise(self._buf[:cut])
            self._consume(cut)
            self._add(segments, piece)
        return segments

    def _add(self, segments: list[str], piece: str) -> None:
        if not piece:
            return
        if _has_text(piece):
            segments.append(piece)
            self._first = False
        elif segments:
            merged = f"{segments[-1]} {piece}"
            if len(merged) <= self.options.max_segment_chars:
                segments[-1] = merged
        # else: punctuation only, nothing to attach it to: not speakable, dropped

    def _next_cut(self, final: bool) -> int | None:
        """End index of the next segment in ``_buf`` (which starts with non-space), or None
        when it cannot be decided without more text."""
        return self._cut_of(self._buf, final)

    def _cut_of(self, buf: str, final: bool) -> int | None:
        """:meth:`_next_cut` of ``buf`` as the buffer."""
        n = len(buf)
        opts = self.options
        limit = opts.max_segment_chars  # the segment is buf[:end] with end ≤ limit
        first_text = next((k for k, ch in enumerate(buf[: limit + 1]) if ch.isalnum()), n)
        if first_text == n and n <= limit and not final:
            return None  # no letter or digit yet: no cut is possible before one arrives
        last_clause: int | None = None
        last_space: int | None = None
        for b in _boundaries(buf, 0, final, horizon=limit):
            if isinstance(b, _Undecided):
                if b.end_min > limit and n > limit:
                    break  # whatever it is, it ends beyond the limit
                return None
            if b.end > limit:
                break
            if b.end <= first_text:
                continue  # no letter or digit before it
            if b.kind is _Kind.SENTENCE:
                if self._first or b.end >= opts.min_segment_chars:
                    return b.end
                last_clause = b.end
            elif b.kind is _Kind.CLAUSE:
                if self._first and b.end >= opts.first_segment_min_chars:
                    return b.end
                last_clause = b.end
            else:
                last_space = b.end
        else:
            if n <= limit:
                return n if final else None
        # Longer than the limit: best boundary within it.
        if last_clause is not None:
            return last_clause
        if last_space is not None:
            return last_space
        return limit

    def _forced_cut(self) -> int:
        """Where a deadline cuts ``_buf``: everything, except an unfinished trailing word (and,
        when only a short tail would remain, the partial clause it belongs to)."""
        buf = self._buf
        n = len(buf)
        last = buf[-1]
        if last.isspace() or not last.isalnum():
            return n  # the last word is complete (or ends with punctuation)
        word_start = n
        while word_start > 0 and not buf[word_start - 1].isspace():
            word_start -= 1
        if word_start == 0 or not _has_text(buf[:word_start]):
            return n  # a single word: it cannot be kept back
        last_clause: int | None = None
        for b in _boundaries(buf[:word_start], 0, final=True):
            if isinstance(b, _Boundary) and b.kind is not _Kind.SPACE and _has_text(buf[: b.end]):
                last_clause = b.end
        if last_clause is not None and len(buf[last_clause:].strip()) <= max(
            self.options.first_segment_min_chars, 1
        ):
            return last_clause
        return word_start


def segment_text(text: str, options: SegmenterOptions | None = None) -> list[str]:
    """All segments of a complete text (as if pushed at once, then flushed)."""
    segmenter = TextSegmenter(options)
    return segmenter.push(text, 0.0) + segmenter.flush()
