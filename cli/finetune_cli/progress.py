"""A progress bar for long transfers: redrawn in place on a terminal, silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .display import duration

BAR_WIDTH = 24
REDRAW_SECONDS = 0.2


def size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # unreachable: the loop returns at GiB


class Progress:
    """Bytes done of a total; `sent` counts only what crossed the wire (the rate), not what a
    resume found already there."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.done, self.sent = total, 0, 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.monotonic()
        self._drawn = 0.0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed if self.elapsed > 0 else 0.0

    def skip(self, count: int) -> None:
        self.done += count
        self.draw()

    def advance(self, count: int) -> None:
        self.done += count
        self.sent += count
        self.draw()

    def line(self) -> str:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * BAR_WIDTH)
        eta = (self.total - self.done) / self.rate if self.rate > 0 else None
        return (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction * 100:5.1f}%  {size(self.done)} / "
            f"{size(self.total)}  {size(self.rate)}/s  ETA {duration(eta) if eta is not None else '-'}"
        )

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.live and (force or now - self._drawn >= REDRAW_SECONDS):
            self._drawn = now
            self.stream.write("\r" + self.line() + "\033[K")
            self.stream.flush()

    def note(self, message: str) -> None:
        """A line of its own above the bar."""
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(message + "\n")
        self.stream.flush()
        self.draw(force=True)

    def close(self) -> None:
        if self.live:
            self.draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
