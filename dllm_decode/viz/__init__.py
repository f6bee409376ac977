"""Views of a decode: the canvas step by step in a terminal (`terminal`), in one self-contained
HTML file (`html`), and its generation-order metrics (`order`), all read from the frames
`frames` rebuilds from `generate(..., trace=True)`. `rich` (the `viz` extra) is needed only by
the terminal animation."""

from dllm_decode.viz.frames import Frame, SampleTrace, result_frames, token_labels
from dllm_decode.viz.order import OrderStats, afp, kendall_tau_b, order_stats

__all__ = ["Frame", "OrderStats", "SampleTrace", "afp", "kendall_tau_b", "order_stats", "result_frames",
           "token_labels"]
