"""The evaluation harness: the decoding grid, the resumable runner, records, summaries, reports,
plots, data-parallel helpers, tuned presets and the lm-evaluation-harness adapter."""
