"""The MLP of a block, dense or one expert: its parameters and its up-projection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812

if TYPE_CHECKING:
    from hetpar.runtime.model import ParamInfo
    from hetpar.specs.model import ModelSpec


def infos(out: dict[str, ParamInfo], m: ModelSpec, pre: str, width: int,
          split: bool) -> None:
    """Add the MLP ``pre`` of inner width ``width``: its inputs (``wg``, ``wu`` for SwiGLU,
    else ``w1``), its output ``w2``, and biases if the model has them (``formulas.mlp_params``).

    ``split``: Megatron TP (Shoeybi et al. 2019, sec. 3) splits the inputs by output rows
    (units) and the output by columns; an expert is whole on its rank (etp = 1)."""
    from hetpar.runtime.model import ParamInfo

    rows, cols = (0, 1) if split else (None, None)
    for name in ("wg", "wu") if m.mlp == "swiglu" else ("w1",):
        out[pre + name] = ParamInfo((width, m.hidden), rows, "normal")
        if m.bias:
            out[pre + "b" + name[1:]] = ParamInfo((width,), rows, "zeros")
    out[pre + "w2"] = ParamInfo((m.hidden, width), cols, "normal")
    if m.bias:
        out[pre + "b2"] = ParamInfo((m.hidden,), None, "zeros")


def up(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, h: torch.Tensor) -> torch.Tensor:
    """The MLP's activated inner layer: SwiGLU (Shazeer 2020) or GELU."""
    if m.mlp == "swiglu":
        return F.silu(F.linear(h, p[pre + "wg"], p.get(pre + "bg"))) * F.linear(
            h, p[pre + "wu"], p.get(pre + "bu"))
    return F.gelu(F.linear(h, p[pre + "w1"], p.get(pre + "b1")))


def whole(m: ModelSpec, p: dict[str, torch.Tensor], pre: str, h: torch.Tensor) -> torch.Tensor:
    """An unsplit MLP (an expert, a shared expert): up, then ``w2`` and its bias."""
    return F.linear(up(m, p, pre, h), p[pre + "w2"], p.get(pre + "b2"))
