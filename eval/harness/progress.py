"""Progress of an evaluation on stderr: tqdm's bar on a terminal, a log line every
`log_every` seconds elsewhere (a CI log, `nohup`, a pipe), so a long run never goes silent."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Samples done, running accuracy, rate and ETA.

    On a terminal tqdm redraws one line in place; on anything else the same meter (tqdm's
    `format_meter`) is written as a plain line every `log_every` seconds, and at the end of a
    run that wrote one (a run shorter than `log_every` stays quiet). A ticker thread redraws the
    bar every second and writes the plain line on time even while a long batch runs, and the rate
    is the whole run's average, so the time left grows when samples slow down. Disabled (or
    nothing to do): every call is a no-op.
    """

    def __init__(self, total: int, label: str = "eval", stream: TextIO | None = None,
                 enabled: bool = True, log_every: float = 30.0):
        self.total, self.label, self.log_every = total, label, log_every
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.done, self.score_sum = 0, 0.0
        self.started = self.last_line = time.perf_counter()
        self.lines = 0
        self._lock = threading.Lock()
        isatty = getattr(self.stream, "isatty", lambda: False)
        # smoothing=0: the rate is the whole run's (samples / elapsed), so a slow batch after fast
        # ones raises the time left instead of keeping the fast batches' estimate
        self.bar = (tqdm(total=total, desc=label, file=self.stream, unit="sample", leave=True,
                         dynamic_ncols=True, smoothing=0) if self.enabled and isatty() else None)
        self._stop = threading.Event()
        self._ticker = None
        if self.enabled:        # redraw while a batch runs: elapsed and time left keep moving
            self._ticker = threading.Thread(target=self._tick, daemon=True, name="eval-progress")
            self._ticker.start()

    def _tick(self, every: float = 1.0) -> None:
        while not self._stop.wait(every):
            with self._lock:
                if self.bar is not None:
                    self.bar.refresh()
                elif self.log_every >= every and time.perf_counter() - self.last_line >= self.log_every:
                    self._write_line()

    @property
    def accuracy(self) -> float:
        return 100 * self.score_sum / max(self.done, 1)

    def update(self, scores: list[float]) -> None:
        """Count finished samples and their scores (0-1)."""
        self.done += len(scores)
        self.score_sum += sum(scores)
        if not self.enabled:
            return
        with self._lock:
            if self.bar is not None:
                self.bar.set_postfix_str(f"acc {self.accuracy:.1f}%", refresh=False)
                self.bar.update(len(scores))
                return
            now = time.perf_counter()
            if now - self.last_line >= self.log_every or (self.done >= self.total and self.lines):
                self._write_line(now)

    def _write_line(self, now: float | None = None) -> None:
        self.last_line = now or time.perf_counter()
        self.lines += 1
        self.stream.write(self.line(self.last_line) + "\n")
        self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """`label: 40%|####      | 40/100 [00:12<00:18, 3.3 sample/s, acc 97.5%]`."""
        elapsed = (now or time.perf_counter()) - self.started
        return tqdm.format_meter(self.done, self.total, elapsed, ncols=80, prefix=self.label,
                                 unit="sample", postfix=f"acc {self.accuracy:.1f}%")

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.bar is not None:
            self.bar.close()
