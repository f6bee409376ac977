"""Tensor parallelism on `torch.distributed` (launched by `torchrun`; NCCL on GPUs, gloo on CPUs).

  * `groups`: the (dp, tp) mesh from the environment (`init_parallel`, `current_groups`).
  * `plan`: the one table that shards every dense family, and `shard_model`.
  * `layers`: the row-parallel linear and the vocabulary-parallel embedding and head.
  * `loading`: each rank reads only its slices of the safetensors files.
  * `collectives`: the functional collectives used, and `CollectiveCounter`.

Every rank runs the unchanged decode loop on the same inputs: the logits after the head's
all_gather are bitwise identical on every rank, so every rank takes the same decisions with no
broadcast.
"""

from dllm_decode.parallel.collectives import CollectiveCounter
from dllm_decode.parallel.groups import (ParallelError, ParallelGroups, check_tensor_parallel,
                                         check_tensor_size, current_groups, init_parallel,
                                         shutdown_parallel)
from dllm_decode.parallel.plan import shard_model
from dllm_decode.parallel import llada2 as _llada2  # noqa: F401  (registers LLaDA2's TP + EP plan)
from dllm_decode.parallel import diffusion_gemma as _gemma  # noqa: F401  (registers DiffusionGemma's plan)

__all__ = ["CollectiveCounter", "ParallelError", "ParallelGroups", "check_tensor_parallel",
           "check_tensor_size", "current_groups", "init_parallel", "shard_model",
           "shutdown_parallel"]
