"""Hugging Face ``config.json`` -> ModelSpec, exact to the parameter (checked with transformers)."""

from __future__ import annotations

from typing import Any

from hetpar.errors import ConfigError
from hetpar.hf.dense import DENSE_SHAPERS
from hetpar.hf.families import FAMILIES, Family, family_name
from hetpar.hf.moe import SHAPERS
from hetpar.hf.ssm import SSM_SHAPERS
from hetpar.io import from_dict
from hetpar.specs.model import ModelSpec

_REQUIRED = object()

DEFAULT_SEQ_LEN = 4096
"""Training sequence length of an imported config when none is given (capped at the model's
context window). A config states only the window it can read (Qwen2-7B: 131,072), not the
length it is trained at; 4096 is Llama 2's pre-training length (Touvron et al. 2023, Sec. 2.2)."""


def _get(data: dict[str, Any], keys: tuple[str, ...], where: str, default: Any = _REQUIRED) -> Any:
    for k in keys:
        if k in data and data[k] is not None:
            return data[k]
    if default is _REQUIRED:
        raise ConfigError(f"{where}: missing key {keys[0]!r}")
    return default


def _positive_int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _bool(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _window(data: dict[str, Any], fam: Family, where: str) -> int:
    """The context a training run may use: RoPE models extended to long context (Llama 3.1's
    rope_scaling) record their pre-extension length; learned positions, the table size."""
    window = _positive_int(_get(data, fam.window_keys, where, fam.window_default or _REQUIRED),
                           where, fam.window_keys[0])
    if fam.fixed["position"] == "learned":
        return window
    for scaling in (data.get("rope_scaling"), data):  # Phi-3 keeps it at the top level
        orig = scaling.get("original_max_position_embeddings") if isinstance(scaling, dict) else 0
        if isinstance(orig, int) and not isinstance(orig, bool) and 1 <= orig < window:
            return orig
    return window


def _shape(data: dict[str, Any], fam: Family, where: str) -> dict[str, int]:
    """The integer shape fields, with the defaults ``transformers`` documents."""
    ints: dict[str, int] = {}
    for name, keys in fam.keys.items():
        if not keys:
            continue
        default: Any = _REQUIRED
        if name == "n_kv_heads":  # absent = multi-head attention
            default = ints["n_heads"]
        elif name in fam.defaults:
            default = fam.defaults[name]
        elif name == "ffn_hidden" and fam.ffn_factor:  # Falcon, GPT-J, BLOOM, MPT: 4 h
            default = fam.ffn_factor * ints["hidden"]
        ints[name] = _positive_int(_get(data, keys, where, default), where, keys[0])
    ints.setdefault("n_kv_heads", ints["n_heads"])
    if "n_experts" in fam.keys and ints["n_experts"] < 2 and not fam.one_expert_dense:
        # transformers still builds a router (and any shared expert) around one expert
        raise ConfigError(f"{where}: {fam.keys['n_experts'][0]}={ints['n_experts']} is not "
                          "representable (hetpar's MoE layers need at least 2 experts)")
    if "ffn_hidden" not in ints and fam.ffn_factor:
        ints["ffn_hidden"] = fam.ffn_factor * ints["hidden"]
    if "ffn_hidden" not in ints:  # GPT-2: n_inner, default 4 x n_embd
        inner = _get(data, ("n_inner",), where, 4 * ints["hidden"])
        ints["ffn_hidden"] = _positive_int(inner, where, "n_inner")
    return ints


def _representable(data: dict[str, Any], fam: Family, where: str) -> None:
    """Refuse switches whose other setting hetpar's model cannot count exactly."""
    for key, only in fam.extra.items():
        value = data.get(key, only)
        if value is not None and value != only:
            raise ConfigError(
                f"{where}: {key}={value!r} is not representable (hetpar models {key}={only!r})"
            )


def _biases(data: dict[str, Any], fam: Family, where: str) -> dict[str, Any]:
    if not fam.bias_keys:
        return {}
    values = {k: _bool(_get(data, (k,), where, fam.bias_default), where, k) for k in fam.bias_keys}
    if len(set(values.values())) > 1 and set(values) == {"attention_bias", "mlp_bias"}:
        # Llama, Granite: attention_bias reaches Q, K, V and O, mlp_bias the MLP
        return {"bias": values["mlp_bias"], "attention_bias": values["attention_bias"]}
    if len(set(values.values())) > 1:
        raise ConfigError(
            f"{where}: {values} is not representable (hetpar's bias switch covers attention "
            "and MLP together)"
        )
    bias = next(iter(values.values()))
    keeps = fam.norm_bias is not None and fam.norm_bias != bias  # norm_bias only where it differs
    return {"bias": bias, **({"norm_bias": fam.norm_bias} if keeps else {})}


def _switches(data: dict[str, Any], fam: Family, where: str) -> dict[str, Any]:
    """The family's boolean switches and scalar multipliers, with its defaults."""
    out: dict[str, Any] = {f: _bool(_get(data, (k,), where, d), where, k)
                           for f, (k, d) in fam.flags.items()}
    for f, (k, d) in fam.floats.items():
        v = _get(data, (k,), where, d)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ConfigError(f"{where}: {k} must be a positive number, got {v!r}")
        out[f] = float(v)
    if fam.rotary_key is not None:
        rope = data.get("rope_parameters")
        nested = rope.get(fam.rotary_key) if isinstance(rope, dict) else None
        v = _get(data, (fam.rotary_key,), where, nested if nested is not None
                 else fam.rotary_default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ConfigError(f"{where}: {fam.rotary_key} must be in (0, 1], got {v!r}")
        out["rotary_fraction"] = float(v)
    return out


def _opt(data: dict[str, Any], ints: dict[str, int], where: str) -> dict[str, Any]:
    """OPT's narrower word embedding and its final norm (modeling_opt.OPTDecoder)."""
    out: dict[str, Any] = {}
    e = _positive_int(_get(data, ("word_embed_proj_dim",), where, ints["hidden"]), where,
                      "word_embed_proj_dim")
    if e != ints["hidden"]:
        out["embed_dim"] = e
    before = _bool(_get(data, ("do_layer_norm_before",), where, True), where,
                   "do_layer_norm_before")
    removed = _bool(_get(data, ("_remove_final_layer_norm",), where, False), where,
                    "_remove_final_layer_norm")
    if not before or removed:
        out["final_norm"] = False
    return out


def training_seq_len(window: int) -> int:
    """hetpar's default training length for a model whose context window is ``window``."""
    return min(DEFAULT_SEQ_LEN, window)


def model_from_hf_config(data: dict[str, Any], name: str, seq_len: int | None = None) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face ``config.json`` dict.

    The architecture comes from ``model_type`` (or ``architectures``); fields use each
    architecture's documented key names and defaults. ``seq_len`` overrides the training
    length (default: ``DEFAULT_SEQ_LEN`` capped at the context window). Unknown
    architectures, missing or mistyped keys, and switches hetpar cannot count exactly
    raise ConfigError.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"hf config {name!r}: expected an object, got {type(data).__name__}")
    fam_name = family_name(data)
    fam = FAMILIES[fam_name]
    where = f"hf config {name!r} ({fam_name})"
    _representable(data, fam, where)
    ints = _shape(data, fam, where)
    fixed = {**fam.fixed, **_biases(data, fam, where), **_switches(data, fam, where)}
    if fam_name == "opt":
        fixed.update(_opt(data, ints, where))
    shaper = SHAPERS.get(fam_name) or DENSE_SHAPERS.get(fam_name) or SSM_SHAPERS.get(fam_name)
    if shaper is not None:
        fixed.update(shaper(data, ints, where))
    tied = _bool(_get(data, ("tie_word_embeddings",), where, fam.tied_default), where,
                 "tie_word_embeddings")
    head_dim = _get(data, ("head_dim",), where, fam.head_dim_default)
    if head_dim is not None:
        head_dim = _positive_int(head_dim, where, "head_dim")
        if head_dim * ints["n_heads"] == ints["hidden"]:
            head_dim = None  # the default; keeps the spec minimal
    window = _window(data, fam, where)
    learned = fixed["position"] == "learned"
    if seq_len is not None and learned and seq_len > window:
        raise ConfigError(f"{where}: seq_len {seq_len} exceeds the {window} learned positions")
    seq = seq_len or training_seq_len(window)
    rows = window + fam.position_offset if learned else None
    source = data.get("_name_or_path") or fam_name
    spec = {**ints, **fixed, "name": name, "tied_embeddings": tied, "head_dim": head_dim,
            "seq_len": seq, "max_positions": rows if rows != seq else None,
            "source": f"Hugging Face config.json ({source}); seq_len {seq}"
            + (" given" if seq_len else f" = hetpar's default training length "
               f"(min({DEFAULT_SEQ_LEN}, context window {window})); a job seq_len overrides it")}
    return from_dict(ModelSpec, spec, where)
