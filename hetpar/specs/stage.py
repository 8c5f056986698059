"""The explicit form of a plan: pipeline stages, data-parallel replicas, and layer splits."""

from __future__ import annotations

from dataclasses import dataclass

from hetpar.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One pipeline stage (a model chunk) on ``tp * cp`` devices of one node group.

    With ``vpp`` virtual stages per rank a replica lists ``pp * vpp`` stages in model order;
    stage ``j`` runs on pipeline rank ``j % pp`` (all chunks of a rank share its devices).
    """

    layers: tuple[int, int]
    """Transformer layers [start, end) of this chunk."""
    group: str
    tp: int
    cp: int = 1
    devices: tuple[int, ...] | None = None
    """Device indices inside ``group`` (tp-major, length tp*cp); None = next free ones."""

    def __post_init__(self) -> None:
        a, b = self.layers
        if not 0 <= a <= b:
            raise ConfigError(
                f"stage: layers must be [start, end) with 0 <= start <= end, got {a, b}"
            )
        if self.tp < 1 or self.cp < 1:
            raise ConfigError(f"stage: tp and cp must be >= 1, got tp={self.tp}, cp={self.cp}")
        if self.devices is not None and len(self.devices) != self.tp * self.cp:
            raise ConfigError(
                f"stage: devices lists {len(self.devices)} devices, tp*cp = {self.tp * self.cp}"
            )
        if self.devices is not None and (
            min(self.devices) < 0 or len(set(self.devices)) != len(self.devices)
        ):
            raise ConfigError(f"stage: devices must be distinct and >= 0, got {list(self.devices)}")

    @property
    def n_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def width(self) -> int:
        """Devices this stage runs on."""
        return self.tp * self.cp


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One data-parallel replica: its stages and its share of the global batch (sequences)."""

    stages: tuple[Stage, ...]
    batch: int
    micro_batch: int

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("replica: stages is empty")
        if self.batch < 1 or self.micro_batch < 1 or self.batch % self.micro_batch:
            raise ConfigError(
                f"replica: batch ({self.batch}) must be a positive multiple of "
                f"micro_batch ({self.micro_batch})"
            )

    @property
    def num_microbatches(self) -> int:
        return self.batch // self.micro_batch


def split_layers(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """Split ``n_layers`` into ``parts`` contiguous ranges, sizes differing by at most one."""
    base, extra = divmod(n_layers, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


EMPTY_END_CHUNKS = 2
"""Most model chunks that may hold no layer: the first (then only the embedding) and the last
(only the LM head and loss). Megatron-Core's ``account_for_embedding_in_pipeline_split`` and
``account_for_loss_in_pipeline_split`` count each as one layer of the split; Llama 3 (Sec.
3.3.2) removes one layer from the first and the last stage so that "the first model chunk on
the first stage has only the embedding, and the last model chunk on the last stage has only
output projection and loss calculation"."""


def min_layers(pp: int, vpp: int) -> int:
    """Fewest layers a split into pp stages of vpp chunks may have with empty end chunks.

    Only a stage's first or last *chunk* may be empty (Llama 3's interleaved split, above):
    every pipeline stage keeps at least one layer. With vpp = 1 a chunk is a whole stage, so
    no chunk may be empty (a stage of only the embedding is not a pipeline stage any
    framework builds: tiny-llama as pp=3 would run a layerless stage)."""
    return pp * vpp - (EMPTY_END_CHUNKS if vpp > 1 else 0)


def padded_split(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """``split_layers``, or with fewer layers than chunks one layer per chunk and the empty
    chunks at the ends, last and first alternately (22 layers as 8 stages x 3 chunks; 126 as
    16 x 8 in Llama 3; see ``EMPTY_END_CHUNKS``)."""
    if n_layers >= parts:
        return split_layers(n_layers, parts)
    empty: set[int] = set()
    lo, hi = 0, parts - 1
    while len(empty) < parts - n_layers:
        empty.add(hi)
        hi -= 1
        if len(empty) < parts - n_layers:
            empty.add(lo)
            lo += 1
    out, start = [], 0
    for j in range(parts):
        size = 0 if j in empty else 1
        out.append((start, start + size))
        start += size
    return out


