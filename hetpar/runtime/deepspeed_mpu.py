"""The model-parallel unit (mpu) hetpar's DeepSpeed script hands ``deepspeed.initialize``.

DeepSpeed asks an mpu for its tensor- and data-parallel groups (Megatron's ``mpu`` interface:
deepspeed/utils/groups.py, deepspeed/utils/bwc.py, deepspeed/runtime/engine.py); with one,
ZeRO partitions and gradients are averaged over the data-parallel group only, and gradient
norms are summed over the model-parallel group. Ranks are laid out TP-fastest, as Megatron
and DeepSpeed's ``PipeModelDataParallelTopology`` do: rank = dp_index * tp + tp_index.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from hetpar.errors import ConfigError
from hetpar.runtime.tp import TPContext


class ModelParallelUnit:
    """The TP and DP groups of this rank. With a pipeline (``pp`` > 1) DeepSpeed takes its
    grid from the PipelineModule's topology instead (pipe, data, model: the same rank order)
    and this unit only supplies the TP groups the decoder's collectives run on."""

    def __init__(self, tp: int, pp: int = 1) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise ConfigError(f"deepspeed_train: tensor_parallel.autotp_size ({tp}) x "
                              f"--pipeline-parallel-size ({pp}) does not divide the world "
                              f"size ({world})")
        self.tp, self.dp, self.rank = tp, world // (tp * pp), rank
        stage, per_stage = rank // (self.dp * tp), self.dp * tp
        self.dp_ranks = [stage * per_stage + d * tp + rank % tp for d in range(self.dp)]
        # new_group is collective over the world: every rank creates every group, in order
        self._tp_group: Any = None
        self._dp_group: Any = None
        for first in range(0, world, tp):
            g = dist.new_group(list(range(first, first + tp)))
            if rank // tp == first // tp:
                self._tp_group = g
        for s in range(pp):
            for t in range(tp):
                ranks = [s * per_stage + d * tp + t for d in range(self.dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    self._dp_group = g

    def tp_context(self) -> TPContext:
        """hetpar's TP context for runtime.model's collectives (Megatron's f and g)."""
        return TPContext(self._tp_group, self.tp, self.rank % self.tp, False)

    # Megatron's names (tensor = model parallel here: no pipeline)
    def get_model_parallel_rank(self) -> int:  # noqa: D102
        return self.rank % self.tp

    def get_model_parallel_world_size(self) -> int:  # noqa: D102
        return self.tp

    def get_model_parallel_group(self) -> Any:  # noqa: D102
        return self._tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_tensor_model_parallel_src_rank(self) -> int:  # noqa: D102
        return self.rank - self.rank % self.tp

    def get_data_parallel_rank(self) -> int:  # noqa: D102
        return self.dp_ranks.index(self.rank)

    def get_data_parallel_world_size(self) -> int:  # noqa: D102
        return self.dp

    def get_data_parallel_group(self) -> Any:  # noqa: D102
        return self._dp_group

    def get_data_parallel_group_ranks(self) -> list[int]:  # noqa: D102
        return list(self.dp_ranks)

    def get_pipeline_model_parallel_world_size(self) -> int:  # noqa: D102
        return 1
