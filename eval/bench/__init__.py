"""Benchmarks behind `dllm-decode bench`: every comparison measured side by side, as ratios.

* `protocol`: what a benchmark declares (`Benchmark`: name, options, quick settings, run,
  format) and the options they share; `benchmarks`: one record file per benchmark, the
  `BENCHMARKS` registry the command is built from;
* `timing`: the one interleaved-repeats runner (rotated order, medians, ratios) and the forward
  timer every benchmark uses;
* `measure`: `Combo` (a labelled `DecodeConfig`) and `run_grid`, decoding under that runner;
* `subject`: the model under test, its prompts and scores, the machine;
* `sections`, `suite`: the suite's diffusion sections (schedulers, stack, loop, gap) and their
  order; `forward`: one forward timed alone (cache ceilings, `torch.compile`);
* `cache`, `scaling`, `spec`: the cache benchmark, length scaling, AR speculative decoding (and
  the suite's AR section); `spec_tree`: trees, staged drafts, BiLD, self-speculation;
* `blockdiff`, `serving`, `shaped`: block diffusion against its AR parent, the server load test,
  the LLaDA-8B-shaped model on any device;
* `oracle_gap`: what the Learn2PD oracle knows, read from traces;
* `report`: the plain-text tables.
"""
