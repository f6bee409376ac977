"""Quantized tensor parallelism: each rank quantizes its shard after sharding, and TP = 2 gives
the logits of the same quantization in one process (gloo, CPU)."""

from dllm_decode.testing import TENSOR_PARALLEL_ULPS
from tests.distributed.harness import run_ranks


def test_tp2_quantized_logits_equal_quantized_one_process(tmp_path):
    results = run_ranks("tests.distributed.quant_ranks", 2, tmp_path, "llada,embedded")
    first = results[0]
    assert len(first) == 8
    for key, record in first.items():
        # per-channel scales span the whole row (a max over the ranks), int4 groups lie inside a
        # shard: the codes are the one-process codes, only the summation order differs; an fp8
        # KV cache quantizes K/V that differ by that rounding, so a code may flip (one e4m3 step)
        if key.endswith("kv-fp8"):
            assert record["relative"] <= 0.02, (key, record["relative"])
        else:
            assert record["ulps"] <= TENSOR_PARALLEL_ULPS, (key, record["ulps"])
        assert record["quantized_layers"] > 0
        assert results[1][key]["digest"] == record["digest"], f"{key}: ranks differ"
