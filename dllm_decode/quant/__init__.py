"""Weight-only low precision: int8, int4 (group-wise) and FP8 e4m3 linear layers, applied as a
module swap (`quantize_model`), saved and loaded as plain safetensors tensors, and the loaders of
the checkpoint layouts the field ships (compressed-tensors FP8, GPTQ int4)."""

from dllm_decode.quant.apply import (check_group_size, prepare_quantized, quantizable,
                                     quantize_model, quantized_layers, weight_bytes)
from dllm_decode.quant.codes import Codes, dequantize, quantize_weight
from dllm_decode.quant.linear import QuantLinear
from dllm_decode.quant.spec import FORMATS, QuantError, QuantSpec

__all__ = ["FORMATS", "Codes", "QuantError", "QuantLinear", "QuantSpec", "check_group_size",
           "dequantize", "prepare_quantized", "quantizable", "quantize_model", "quantized_layers",
           "quantize_weight", "weight_bytes"]
