"""A one-line progress bar on stderr: samples done, running accuracy, rate and ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Redraws `label [####....] done/total acc x% rate ETA` in place (`\\r`), at most every
    `interval` seconds and always at the end. Disabled: every call is a no-op."""

    def __init__(self, total: int, label: str = "eval", stream: TextIO | None = None,
                 enabled: bool = True, interval: float = 0.2, width: int = 24):
        self.total, self.label, self.width, self.interval = total, label, width, interval
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.done, self.score_sum = 0, 0.0
        self.started = self.last_draw = time.perf_counter()

    def update(self, scores: list[float]) -> None:
        """Count finished samples and their scores (0-1)."""
        self.done += len(scores)
        self.score_sum += sum(scores)
        now = time.perf_counter()
        if self.enabled and (now - self.last_draw >= self.interval or self.done >= self.total):
            self.last_draw = now
            self.stream.write("\r" + self.line(now))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.perf_counter()) - self.started
        filled = int(self.width * self.done / max(self.total, 1))
        accuracy = 100 * self.score_sum / max(self.done, 1)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total}"
                f" acc {accuracy:5.1f}% {rate:.1f} samples/s ETA {_clock(eta)} ")

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
