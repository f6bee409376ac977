"""The benchmark records behind `dllm-decode bench`, one file each (the suite's file holds the
suite and its sections): `BENCHMARKS` maps each name to its `protocol.Benchmark`. Importing this
package loads no torch; each record loads its machinery when it runs."""

from dllm_decode.eval.bench.benchmarks import (bd, cache, runtime, scaling, serving, shaped, spec, suite,
                                               tp, tree)

BENCHMARKS = {b.name: b for b in (*suite.BENCHMARKS, runtime.BENCHMARK, cache.BENCHMARK, scaling.BENCHMARK,
                                  spec.BENCHMARK, bd.BENCHMARK, serving.BENCHMARK, tree.BENCHMARK,
                                  shaped.BENCHMARK, tp.BENCHMARK)}
