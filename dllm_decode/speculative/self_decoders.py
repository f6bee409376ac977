"""Self-speculative decoders of diffusion models: `SELF_DECODERS` names them.

The model drafts and verifies its own tokens (no second model). Each entry is a frozen dataclass of
its options (`blockrun.SelfDecoder`), built by `registry.component("self_decoder", ...)`, whose
`decode(model, prompts, config)` runs a batch under `config`'s base rule and returns a
`blockrun.SpecDecode` (the `DecodeResult`, verification forwards counted in its NFE). The single
FreeDave chain check of batch 1 stays `selfspec.self_speculative_generate`.
"""

from dllm_decode.speculative.blockrun import SpecDecode
from dllm_decode.speculative.self_decoder import SelfDecoder, ar_mode_generate
from dllm_decode.speculative.psd import PSD
from dllm_decode.speculative.s2d2 import S2D2
from dllm_decode.speculative.simsd import SimSD

SELF_DECODERS: dict[str, type[SelfDecoder]] = {
    "s2d2": S2D2,     # block model verifies its diffusion span in AR mode (arXiv 2603.25702)
    "psd": PSD,       # multi-depth drafts from one forward, one batched verify (arXiv 2605.15609)
    "simsd": SimSD,   # a drafted block verified in one step-causal forward (arXiv 2606.02544)
}

__all__ = ["PSD", "S2D2", "SELF_DECODERS", "SelfDecoder", "SimSD", "SpecDecode", "ar_mode_generate"]
