"""Parameters, FLOPs and HBM traffic of one selective state-space (Mamba, Mamba-2) mixer."""

from __future__ import annotations

from hetpar.specs.ssm import SsmSpec

# Notation: h hidden, I = d_inner, N state size, K conv width, R dt rank, H heads, G groups,
# C conv channels (I; Mamba-2: I + 2 G N), Q the SSD chunk length.


def ssm_matrices(s: SsmSpec, hidden: int) -> tuple[tuple[int, int], ...]:
    """The mixer's weight matrices (rows in, columns out), in a token's order.

    Mamba (Gu & Dao 2023, Alg. 2; transformers' MambaMixer): in_proj h -> 2 I (x and the gate
    z), x_proj I -> R + 2 N (dt, B, C), dt_proj R -> I, out_proj I -> h. Mamba-2 (Dao & Gu
    2024, Sec. 7.1 "parallel projections"; Mamba2Mixer): one in_proj h -> 2 I + 2 G N + H
    (z, x, B, C, dt), out_proj I -> h.
    """
    i, n = s.inner, s.state_size
    if s.kind == "mamba":
        r = s.dt_rank or 0
        return ((hidden, 2 * i), (i, r + 2 * n), (r, i), (i, hidden))
    return ((hidden, 2 * i + 2 * s.groups * n + s.heads), (i, hidden))


def ssm_matmul_weights(s: SsmSpec, hidden: int) -> int:
    """Weights a token multiplies through in the mixer's projections."""
    return sum(a * b for a, b in ssm_matrices(s, hidden))


def ssm_params(s: SsmSpec, hidden: int) -> int:
    """All parameters of one mixer, as transformers 5.25 builds them.

    Besides the projections: the depthwise conv (C K, plus C with conv_bias); Mamba: dt_proj's
    bias (I), A_log (I x N), D (I), Jamba's dt/B/C RMSNorm gains (R + 2 N); Mamba-2: dt_bias,
    A_log and D per head (3 H) and the gated RMSNorm before out_proj (I); biases on in_proj
    and out_proj with proj_bias.
    """
    i, n, c = s.inner, s.state_size, s.conv_channels
    conv = c * s.conv_width + (c if s.conv_bias else 0)
    first, last = ssm_matrices(s, hidden)[0][1], hidden
    bias = first + last if s.proj_bias else 0
    if s.kind == "mamba":
        r = s.dt_rank or 0
        extra = i + i * n + i + ((r + 2 * n) if s.dt_norms else 0)
    else:
        extra = 3 * s.heads + i
    return ssm_matmul_weights(s, hidden) + conv + bias + extra


def ssm_core_flops_per_token(s: SsmSpec) -> float:
    """Forward FLOPs per token outside the projections: the conv and the scan.

    Conv: 2 K C (a multiply-add per tap and channel). Mamba's selective scan (Gu & Dao 2023,
    eqs. 2a-2b and 4 discretised per token): per channel and state, dt x A (1), dt x B x x (2),
    h = Abar h + Bbar x (2), y = C h (2): 7 I N. Mamba-2's chunked SSD (Dao & Gu 2024, Sec. 6,
    its four steps): within a chunk C B^T per group (2 Q G N) and the masked scores times x
    per head (2 Q I), the chunk's state B^T x (2 N I) and the state's output C h (2 N I):
    2 Q (G N + I) + 4 N I, counted without the causal mask's saving, as attention is here.
    Exponentials, the gate and the D skip are elementwise and left out, like the softmax.
    """
    i, n = s.inner, s.state_size
    conv = 2.0 * s.conv_width * s.conv_channels
    if s.kind == "mamba":
        return conv + 7.0 * i * n
    return conv + 2.0 * s.chunk * (s.groups * n + i) + 4.0 * n * i


def ssm_kernel_bytes_per_token(s: SsmSpec, act_bytes: float) -> float:
    """HBM bytes the conv and scan kernels move per token (forward).

    The fused kernels keep the state on chip (Gu & Dao 2023, Sec. 3.3.2 "kernel fusion";
    Dao & Gu 2024, Sec. 6): the conv reads and writes its C channels; the scan reads x, dt,
    B, C and the gate z and writes y: 2 C + 3 I + dt + 2 G N elements (dt: I wide in Mamba,
    H in Mamba-2; Mamba has G = 1).
    """
    i, n, c = s.inner, s.state_size, s.conv_channels
    dt = i if s.kind == "mamba" else s.heads
    return act_bytes * (2 * c + 3 * i + dt + 2 * s.groups * n)


def ssm_activation_elements(s: SsmSpec) -> int:
    """Elements per token one mixer keeps for backward beyond its input, tensor by tensor:
    the inputs of each matmul, of the conv and of the scan, with the scan's states recomputed
    in backward (Gu & Dao 2023, Sec. 3.3.2 "recomputation"). Mamba: x and z (2 I), the conv
    output (I), x_proj's output (R + 2 N), dt (I), the scan output (I, out_proj's input).
    Mamba-2: in_proj's output (2 I + 2 G N + H), the conv output (I + 2 G N), the scan output
    (I) and the gated norm's output (I, out_proj's input)."""
    i, n = s.inner, s.state_size
    if s.kind == "mamba":
        return 5 * i + (s.dt_rank or 0) + 2 * n
    return 5 * i + 4 * s.groups * n + s.heads
