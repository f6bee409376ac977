"""Progress of an evaluation on stderr: tqdm's bar on a terminal, a log line every
`log_every` seconds elsewhere (a CI log, `nohup`, a pipe), so a long run never goes silent."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Samples done, running accuracy, rate and ETA.

    On a terminal tqdm redraws one line in place; on anything else the same meter (tqdm's
    `format_meter`) is written as a plain line every `log_every` seconds, and at the end of a
    run that wrote one (a run shorter than `log_every` stays quiet). Disabled (or nothing to
    do): every call is a no-op.
    """

    def __init__(self, total: int, label: str = "eval", stream: TextIO | None = None,
                 enabled: bool = True, log_every: float = 30.0):
        self.total, self.label, self.log_every = total, label, log_every
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.done, self.score_sum = 0, 0.0
        self.started = self.last_line = time.perf_counter()
        self.lines = 0
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.bar = (tqdm(total=total, desc=label, file=self.stream, unit="sample", leave=True,
                         dynamic_ncols=True) if self.enabled and isatty() else None)

    @property
    def accuracy(self) -> float:
        return 100 * self.score_sum / max(self.done, 1)

    def update(self, scores: list[float]) -> None:
        """Count finished samples and their scores (0-1)."""
        self.done += len(scores)
        self.score_sum += sum(scores)
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"acc {self.accuracy:.1f}%", refresh=False)
            self.bar.update(len(scores))
            return
        now = time.perf_counter()
        if now - self.last_line >= self.log_every or (self.done >= self.total and self.lines):
            self.last_line = now
            self.lines += 1
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        """`label: 40%|####      | 40/100 [00:12<00:18, 3.3 sample/s, acc 97.5%]`."""
        elapsed = (now or time.perf_counter()) - self.started
        return tqdm.format_meter(self.done, self.total, elapsed, ncols=80, prefix=self.label,
                                 unit="sample", postfix=f"acc {self.accuracy:.1f}%")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
