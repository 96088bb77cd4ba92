"""An independent float64 NumPy implementation of PureAttention's layer models.

What: the `model.layers` sugar of a config (README "Model": `linear` and `attention` with every
option: activations, bias, heads, kv_heads (grouped-query), head_dim, causal, align, window,
sinks, sink_logits, residual; and the transformer-block layers: `norm` (layer | rms), `position`
(learned | sinusoidal), `mlp` (relu | gelu | gelu_tanh | silu | swiglu), attention's `bias`,
`rope` (half-split or interleaved, on part or all of the head), `pre_norm` / `post_norm` and
`residual` on linear, attention and mlp, and `repeat` (unrolled with distinct parameters per
repeat and its cycled `overrides`)), built from the resolved config YAML that a checkpoint
carries in its metadata, plus one sample's data shapes. It gives the parameter names and shapes
the graph uses, seeded random weights of those shapes, the forward pass and the MSE loss.

Parameter names: a top-level layer i has prefix `layers.<i>`; a layer inside `repeat: {name, ...}`
has `<name>.<r>.<key>`, key its kind, or `<kind>_<k>` where the kind occurs more than once in the
repeat's list (repeat_keys). Under a prefix p: linear `p.weight`, `p.bias`; attention
`p.{q,k,v,o}_{weight,bias}`, `p.sink_logits`; mlp `p.{gate,up,down}_{weight,bias}` (gate for
swiglu); a block's norm `p.norm_gain`, `p.norm_bias` (layer kind); norm `p.gain`, `p.bias`;
position `p.table` (learned).

Why: tests/interop/check_interop.py compares `train` and `predict` against it, so it must share
nothing with the C++ code. It is written from README's definitions alone ("How layers lower to
primitives", "Attention masks"), in float64, so that its own rounding (~1e-16) is negligible
beside float32's (~6e-8).

It also estimates, per output element, the size of the error that a float32 evaluation of the
same model may make (`forward_with_error_scale`), from which the checks derive their tolerances
instead of picking one; see "Note on the float32 error scale" below.

Explicit `params`/`nodes` graphs are not supported (NotSupported is raised).

Conventions that matter when comparing with other code:
- a linear layer computes x @ W + b with W [in, out]: the transpose of torch.nn.Linear.weight;
- attention parameters are `<p>.{q,k,v,o}_{weight,bias}` and `<p>.sink_logits`;
- rotary and sinusoidal tables are computed in float64 (a float32 program rounds them once);
- the model's input is each sample reshaped to `model.input` (default: the data's sample shape);
  the target is compared with the prediction after being reshaped to the prediction's shape.

Note on the float32 error scale
-------------------------------
The model of rounding: every float32 operation returns x (1 + d) with |d| <= u = 2^-24, the d
independent with mean zero. Under it an n-term dot product's error is at most about
lambda * sqrt(n) * u * (|x|.|w|), in any summation order, with probability at least
1 - 2n exp(-lambda^2 / 2) (Higham and Mary, "A new approach to probabilistic rounding error
analysis", SIAM J. Sci. Comput. 41(5), 2019; the n is a union bound over the partial sums and
makes it loose). The worst-case bound, n u (|x|.|w|) carried through |W|, grows like
(n u) (sqrt n)^depth beside the values and exceeded the predictions themselves on mlp_wide
(three 1024-wide layers): useless as a tolerance. So each value carries a one-sigma error scale
`s`, propagated to first order with independent errors added in quadrature (propagation of
uncertainty; squares and |.| elementwise, products as matrix products):
- linear y = x W + b (K inputs):  s_y^2 = s_x^2 W^2 + (K + 1) u^2 (|x| |W| + |b|)^2
- activation f, Lipschitz L:      s_y = L s_x + c_f u |f(x)|  (c_f ulps for erf/tanh/exp-based f)
- scores s = q k^T / sqrt(hd):    s_s^2 = (s_q^2 (k^2)^T + q^2 (s_k^2)^T
                                           + (hd + 1) u^2 (|q| |k|^T)^2) / hd
- softmax p (dp_j = p_j (ds_j - sum_l p_l ds_l)):
                                  s_p^2 = p^2 (s_s^2 + sum_l p_l^2 s_s_l^2 + r^2)
  where r = u sqrt((|s| + |m|)^2 + Sk + c) covers exp's argument rounding, exp itself, the
  Sk + 1-term denominator, the division and an online softmax's rescaling per 64-key tile;
- out = p v:                      s_o^2 = s_p^2 v^2 + p^2 s_v^2 + Sk u^2 (p |v|)^2
- residual x + a(x):              s = sqrt(s_x^2 + s_a^2) + u |x + a|  (in quadrature: a's error
                                  holds J s_x, J the body's Jacobian, which random weights leave
                                  uncorrelated with s_x; added linearly, as before the transformer
                                  blocks, the scale doubled per residual layer and, over a dozen,
                                  grew 10^3 beyond the measured errors)
- norms, rotary positions, mlp, positions: see Model._norm, apply_rope, Model._mlp, Model._layer
A check then allows lambda * s with lambda = 6 (+ 5e-9 relative for 9 printed significant
digits). The model is pessimistic (|d| = u taken as the typical size; blocked and pairwise sums
grow slower than sqrt(n)): on the example configs the largest difference of `predict` from this
reference was 0.04 of that allowance (0.25 s). A wrong layer (a transposed weight, a mask shifted
by one key, a dropped sink logit) is off by 10^3 to 10^5 allowances instead (measured by
mutating this file).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import yaml

U32 = 2.0 ** -24  # float32 unit roundoff


class NotSupported(Exception):
    """A model this reference does not implement (explicit params/nodes graphs, a repeat inside a
    repeat, an unknown key or kind)."""


def _f32(a):
    """float32 copy, for the error-scale computations (module docstring)."""
    return np.asarray(a, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Activations: (function, Lipschitz constant, ulps of a float32 evaluation for the error scale).

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    """The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as README says (not tanh's)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation, torch's gelu(approximate='tanh'):
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) written as 0.5 (1 + tanh(x / 2)), which cannot overflow."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


ACTIVATIONS = {
    "none": (lambda x: x, 1.0, 0.0),
    "relu": (lambda x: np.maximum(x, 0.0), 1.0, 0.0),
    # max |gelu'(x)| = 1.1289 (at x = sqrt 2); the tanh form's is within 1e-3 of it
    "gelu": (_gelu, 1.13, 8.0),
    "gelu_tanh": (_gelu_tanh, 1.13, 8.0),
    # silu(x) = x sigmoid(x); max |silu'(x)| = 1.0998 (at x = 2.3994)
    "silu": (lambda x: x * _sigmoid(x), 1.1, 6.0),
    "tanh": (np.tanh, 1.0, 4.0),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), 0.25, 4.0),
}
MLP_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu")


# ---------------------------------------------------------------------------------------------
# Layer specifications, read from the resolved config.

@dataclass(frozen=True)
class NormSpec:
    """A normalisation over the last axis: `layer` ((x - mean) / sqrt(var + eps) * gain + bias,
    biased variance, as torch.nn.LayerNorm) or `rms` (x / sqrt(mean(x^2) + eps) * gain, as
    torch.nn.RMSNorm)."""
    kind: str
    eps: float = 1e-5


@dataclass(frozen=True)
class Rope:
    """Rotary positions on q and k (per head, positions 0..S-1): for j < dims/2 the pair
    (j, j + dims/2) (half-split, HF Llama's rotate_half) or (2j, 2j+1) (interleaved) turns by
    s * base^(-2j/dims); dims 0 means the whole head; features >= dims are left alone."""
    base: float = 10000.0
    dims: int = 0
    interleaved: bool = False


@dataclass(frozen=True)
class Linear:
    """`linear: {units, activation, bias, residual, pre_norm, post_norm}`: act(x @ W + b) over the
    last axis, inside the residual block (see `Model._block`)."""
    units: int
    activation: str = "none"
    bias: bool = True
    residual: bool = False
    pre_norm: Optional[NormSpec] = None
    post_norm: Optional[NormSpec] = None


@dataclass(frozen=True)
class Attention:
    """`attention: {...}` over a [seq, features] sample; every key of README's table."""
    heads: int = 1
    kv_heads: Optional[int] = None      # None: heads
    head_dim: Optional[int] = None      # None: width / heads
    causal: bool = False
    align: str = "top-left"
    window_left: Optional[int] = None   # None: unbounded
    window_right: Optional[int] = None  # None: unbounded
    sinks: int = 0
    sink_logits: bool = False
    residual: bool = False
    bias: bool = True                   # q, k, v and o biases
    rope: Optional[Rope] = None
    pre_norm: Optional[NormSpec] = None
    post_norm: Optional[NormSpec] = None


@dataclass(frozen=True)
class Mlp:
    """`mlp: {hidden, activation, bias, residual, pre_norm, post_norm}`: the width stays.
    h = act(x @ up + up_bias), or for swiglu h = silu(x @ gate + gate_bias) * (x @ up + up_bias);
    out = h @ down + down_bias."""
    hidden: int
    activation: str = "gelu"
    bias: bool = True
    residual: bool = False
    pre_norm: Optional[NormSpec] = None
    post_norm: Optional[NormSpec] = None


@dataclass(frozen=True)
class Norm:
    """`norm: {kind: layer|rms, eps}` as a layer: parameters `gain` (and `bias` for layer)."""
    kind: str
    eps: float = 1e-5


@dataclass(frozen=True)
class Position:
    """`position: {kind: learned|sinusoidal}`: adds a [seq, features] table (learned: the
    parameter `table`; sinusoidal: table[s, 2i] = sin(s / 10000^(2i/F)), table[s, 2i+1] =
    cos(the same angle))."""
    kind: str = "learned"


BLOCK_KEYS = {"residual", "pre_norm", "post_norm"}


def _reject_unknown(kind: str, d: dict, known: set) -> None:
    # A key this reference does not know would be silently ignored otherwise, and the comparison
    # would then test a different model from the one `train` built.
    unknown = set(d) - known
    if unknown:
        raise NotSupported(f"{kind} keys {sorted(unknown)} (known: {sorted(known)})")


def _parse_norm_spec(v, where: str) -> Optional[NormSpec]:
    """None, false or 'none': no norm; 'layer' / 'rms'; or a map {kind, eps}."""
    if v is None or v is False or v == "none":
        return None
    if isinstance(v, str):
        kind, eps = v, 1e-5
    elif isinstance(v, dict):
        _reject_unknown(where, v, {"kind", "eps"})
        kind, eps = v.get("kind"), float(v.get("eps", 1e-5))
    else:
        raise NotSupported(f"{where}: expected layer, rms or {{kind, eps}}, got {v!r}")
    if kind not in ("layer", "rms"):
        raise NotSupported(f"{where}.kind '{kind}' (known: layer, rms)")
    if not eps > 0:
        raise ValueError(f"{where}.eps must be > 0, got {eps}")
    return NormSpec(kind=kind, eps=eps)


def _parse_block(kind: str, d: dict) -> dict:
    pre = _parse_norm_spec(d.get("pre_norm"), f"{kind}.pre_norm")
    post = _parse_norm_spec(d.get("post_norm"), f"{kind}.post_norm")
    if pre is not None and post is not None:
        raise ValueError(f"{kind}: pre_norm and post_norm are both set (one per layer)")
    return {"residual": bool(d.get("residual", False)), "pre_norm": pre, "post_norm": post}


def _parse_linear(d: dict) -> Linear:
    _reject_unknown("linear", d, {"units", "activation", "bias"} | BLOCK_KEYS)
    act = d.get("activation", "none")
    if act not in ACTIVATIONS:
        raise NotSupported(f"linear.activation '{act}' (known: {', '.join(ACTIVATIONS)})")
    return Linear(units=int(d["units"]), activation=act, bias=bool(d.get("bias", True)),
                  **_parse_block("linear", d))


def _parse_rope(v) -> Optional[Rope]:
    """Absent, null or false: none; true or {}: every default; a map {base, dims, interleaved}."""
    if v is None or v is False:
        return None
    if v is True:
        return Rope()
    if not isinstance(v, dict):
        raise NotSupported(f"attention.rope: expected true, false or a map, got {v!r}")
    _reject_unknown("attention.rope", v, {"base", "dims", "interleaved"})
    r = Rope(base=float(v.get("base", 10000.0)), dims=int(v.get("dims", 0)),
             interleaved=bool(v.get("interleaved", False)))
    if r.dims < 0 or r.dims % 2:
        raise ValueError(f"attention.rope.dims must be even and >= 0, got {r.dims}")
    if not r.base > 0:
        raise ValueError(f"attention.rope.base must be > 0, got {r.base}")
    return r


def _parse_attention(d: dict) -> Attention:
    known = {"heads", "kv_heads", "head_dim", "causal", "align", "window", "sinks", "sink_logits",
             "bias", "rope"} | BLOCK_KEYS
    _reject_unknown("attention", d, known)
    window = d.get("window")
    left = right = None
    if isinstance(window, dict):
        left, right = window.get("left"), window.get("right")
    elif window is not None:  # a number L means {left: L}
        left = window
    align = d.get("align", "top-left")
    if align not in ("top-left", "bottom-right"):
        raise NotSupported(f"attention.align '{align}'")
    return Attention(heads=int(d.get("heads", 1)),
                     kv_heads=None if d.get("kv_heads") is None else int(d["kv_heads"]),
                     head_dim=None if d.get("head_dim") is None else int(d["head_dim"]),
                     causal=bool(d.get("causal", False)), align=align,
                     window_left=None if left is None else int(left),
                     window_right=None if right is None else int(right),
                     sinks=int(d.get("sinks", 0)), sink_logits=bool(d.get("sink_logits", False)),
                     bias=bool(d.get("bias", True)), rope=_parse_rope(d.get("rope")),
                     **_parse_block("attention", d))


def _parse_mlp(d: dict) -> Mlp:
    _reject_unknown("mlp", d, {"hidden", "activation", "bias"} | BLOCK_KEYS)
    act = d.get("activation", "gelu")
    if act not in MLP_ACTIVATIONS:
        raise NotSupported(f"mlp.activation '{act}' (known: {', '.join(MLP_ACTIVATIONS)})")
    return Mlp(hidden=int(d["hidden"]), activation=act, bias=bool(d.get("bias", True)),
               **_parse_block("mlp", d))


def _parse_norm(d) -> Norm:
    spec = _parse_norm_spec(d, "norm")
    if spec is None:
        raise NotSupported(f"norm: expected layer, rms or {{kind, eps}}, got {d!r}")
    return Norm(kind=spec.kind, eps=spec.eps)


def _parse_position(d: dict) -> Position:
    _reject_unknown("position", d, {"kind"})
    kind = d.get("kind", "learned")
    if kind not in ("learned", "sinusoidal"):
        raise NotSupported(f"position.kind '{kind}' (known: learned, sinusoidal)")
    return Position(kind=kind)


PARSERS = {"linear": _parse_linear, "attention": _parse_attention, "mlp": _parse_mlp,
           "norm": _parse_norm, "position": _parse_position}


def _one_kind(entry, where):
    if not isinstance(entry, dict) or len(entry) != 1:
        raise NotSupported(f"{where}: expected one kind per layer, got {entry!r}")
    (kind, body), = entry.items()
    if body is None:
        body = {}
    return kind, body


def repeat_keys(kinds) -> list:
    """The key of each layer of a repeat's list: its kind when that kind occurs once in the list,
    else `<kind>_<k>` with k its 0-based occurrence among the layers of that kind."""
    counts, seen, keys = {}, {}, []
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    for k in kinds:
        if counts[k] == 1:
            keys.append(k)
        else:
            keys.append(f"{k}_{seen.get(k, 0)}")
            seen[k] = seen.get(k, 0) + 1
    return keys


def expand_layers(entries) -> list:
    """model.layers -> [(prefix, kind, body)], repeats unrolled with their overrides applied.

    A top-level layer i has prefix `layers.<i>`; a layer of `repeat: {times: N, name, layers,
    overrides}` has `<name>.<r>.<key>` (repeat_keys), and repeat r replaces the keys of layer
    `key` by overrides[r % len(overrides)][key] (a shallow update of that layer's map)."""
    out = []
    for i, entry in enumerate(entries or []):
        kind, body = _one_kind(entry, f"model.layers[{i}]")
        if kind != "repeat":
            out.append((f"layers.{i}", kind, body))
            continue
        where = f"model.layers[{i}].repeat"
        if not isinstance(body, dict):
            raise NotSupported(f"{where}: expected a map {{times, name, layers, overrides}}")
        _reject_unknown("repeat", body, {"times", "name", "layers", "overrides"})
        times, name = int(body["times"]), str(body.get("name", "blocks"))
        if times < 1:
            raise ValueError(f"{where}.times must be >= 1, got {times}")
        inner = [_one_kind(e, f"{where}.layers[{j}]") for j, e in enumerate(body.get("layers") or [])]
        if not inner:
            raise ValueError(f"{where}.layers is empty")
        if any(k == "repeat" for k, _ in inner):
            raise NotSupported(f"{where}: a repeat inside a repeat")
        keys = repeat_keys([k for k, _ in inner])
        overrides = body.get("overrides") or []
        if not isinstance(overrides, list):
            raise NotSupported(f"{where}.overrides: expected a list of maps, got {overrides!r}")
        for o, item in enumerate(overrides):
            if item is None:
                continue
            if not isinstance(item, dict):
                raise NotSupported(f"{where}.overrides[{o}]: expected a map, got {item!r}")
            bad = set(item) - set(keys)
            if bad:
                raise ValueError(f"{where}.overrides[{o}]: keys {sorted(bad)} name no layer (keys: {keys})")
        for r in range(times):
            item = (overrides[r % len(overrides)] or {}) if overrides else {}
            for key, (kind, lbody) in zip(keys, inner):
                if kind == "norm" and isinstance(lbody, str):
                    lbody = {"kind": lbody}
                lbody = dict(lbody)
                change = item.get(key) or {}
                if not isinstance(change, dict):
                    raise NotSupported(f"{where}.overrides: {key}: expected a map, got {change!r}")
                lbody.update(change)
                out.append((f"{name}.{r}.{key}", kind, lbody))
    return out


def apply_set(config: dict, assignment: str) -> None:
    """`a.b.0.c=value` on a loaded config, as train's --set: list items by index, the value parsed
    as YAML, missing maps created."""
    path, eq, value = assignment.partition("=")
    if not eq or not path or "" in path.split("."):
        raise ValueError(f"--set {assignment!r}: expected key.path=value")
    keys = path.split(".")
    node = config
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = yaml.safe_load(value)
    else:
        node[last] = yaml.safe_load(value)


def sample_shapes(config: dict):
    """One sample's (input, target) shapes from a config's data section, for the kinds whose shapes
    follow from it alone (sine, function); None for others (a CSV file's columns)."""
    d = config.get("data") or {}
    kind = d.get("kind", "sine")
    if kind == "sine":
        window, channels = int(d.get("window", 64)), int(d.get("channels", 1))
        target = d.get("target", "next")
        y = [window, 1] if target in ("sequence", "delayed") else [int(d.get("horizon", 1))]
        return [window, channels], y
    if kind == "function":
        return [int(d.get("inputs", 1))], [1]
    return None


# ---------------------------------------------------------------------------------------------
# The attention mask, from README "Attention masks".

def visible(q_len: int, kv_len: int, causal: bool, align: str, left: Optional[int],
            right: Optional[int], sinks: int) -> np.ndarray:
    """Boolean [q_len, kv_len]: may query q see key k.

    d = q (top-left) or q + kv_len - q_len (bottom-right); causal-ok: k <= d; in-window:
    d - L <= k <= d + R (a missing side unbounded); sink: k < sinks;
    visible = causal-ok and (in-window or sink).
    """
    q = np.arange(q_len)[:, None]
    k = np.arange(kv_len)[None, :]
    d = q if align == "top-left" else q + (kv_len - q_len)
    causal_ok = (k <= d) if causal else np.ones((q_len, kv_len), bool)
    in_window = np.ones((q_len, kv_len), bool)
    if left is not None:
        in_window &= k >= d - left
    if right is not None:
        in_window &= k <= d + right
    return causal_ok & (in_window | (k < sinks))


def attention_visible(layer: Attention, seq: int) -> np.ndarray:
    """The [seq, seq] mask of a self-attention layer."""
    return visible(seq, seq, layer.causal, layer.align, layer.window_left, layer.window_right,
                   layer.sinks)


def softmax_with_sink(s: np.ndarray, vis: np.ndarray, sink: Optional[np.ndarray]) -> np.ndarray:
    """Softmax over the last axis of scores s [B, H, Sq, Sk] where vis [Sq, Sk] is True.

    With sink [H], exp(sink_h) joins every row's denominator and carries no value. A row that sees
    no key gives all-zero probabilities (with a sink: all the mass is on the sink, so zero too).
    """
    neg_inf = np.where(vis, s, -np.inf)
    m = neg_inf.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink[None, :, None, None])
    m = np.where(np.isfinite(m), m, 0.0)  # a row with nothing visible and no sink
    e = np.where(vis, np.exp(np.where(vis, s, 0.0) - m), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        den = den + np.exp(sink[None, :, None, None] - m)
    return np.divide(e, den, out=np.zeros_like(e), where=den > 0)


# ---------------------------------------------------------------------------------------------
# Positions: the sinusoidal table and rotary embeddings (float64; a float32 program that rounds
# these once is within u of them).

def sinusoid_table(seq: int, features: int) -> np.ndarray:
    """[seq, features]: table[s, 2i] = sin(s / 10000^(2i/F)), table[s, 2i+1] = cos(the same)."""
    j = np.arange(features)
    angle = np.arange(seq, dtype=np.float64)[:, None] / np.power(10000.0, (j - j % 2) / features)[None, :]
    return np.where(j % 2 == 0, np.sin(angle), np.cos(angle))


def rope_tables(seq: int, dims: int, base: float):
    """(cos, sin), each [seq, dims/2]: the angle of pair j at position s is s * base^(-2j/dims)."""
    j = np.arange(dims // 2, dtype=np.float64)
    angle = np.arange(seq, dtype=np.float64)[:, None] * np.power(float(base), -2.0 * j / dims)[None, :]
    return np.cos(angle), np.sin(angle)


def rope_pairs(dims: int, interleaved: bool):
    """(i0, i1): the feature indices of each turned pair, j < dims/2: (j, j + dims/2) half-split,
    (2j, 2j + 1) interleaved."""
    half = dims // 2
    if interleaved:
        return 2 * np.arange(half), 2 * np.arange(half) + 1
    return np.arange(half), np.arange(half) + half


def rope_dims(layer: Attention, head_dim: int) -> int:
    return layer.rope.dims or head_dim


def apply_rope(x: np.ndarray, rope: Rope, head_dim: int, s: Optional[np.ndarray] = None):
    """Rotary positions on x [B, S, H, head_dim]: (a, b) -> (a cos - b sin, a sin + b cos) on each
    pair; with s (x's error scale) also the output's (a rotation keeps the size of errors; the
    products, sums and the float32 rounding of cos and sin add a few u)."""
    dims = rope.dims or head_dim
    cos, sin = rope_tables(x.shape[1], dims, rope.base)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    i0, i1 = rope_pairs(dims, rope.interleaved)
    a, b = x[..., i0], x[..., i1]
    y = x.copy()
    y[..., i0] = a * cos - b * sin
    y[..., i1] = a * sin + b * cos
    s_out = None
    if s is not None:
        s_out = s.copy()
        sa, sb = s[..., i0], s[..., i1]
        c32, n32 = _f32(np.abs(cos)), _f32(np.abs(sin))
        mag = _f32(np.abs(a)) * c32 + _f32(np.abs(b)) * n32
        rnd = _f32(3 * U32) * mag + _f32(2 * U32) * _f32(np.abs(a) + np.abs(b))
        s_out[..., i0] = np.sqrt(c32 * c32 * sa * sa + n32 * n32 * sb * sb) + rnd
        s_out[..., i1] = np.sqrt(n32 * n32 * sa * sa + c32 * c32 * sb * sb) + rnd
    return y, s_out


# ---------------------------------------------------------------------------------------------
# The model.

class Model:
    """A layer-sugar model: parameter shapes, random weights, forward, float32 error scale.

    `layers` are the layer specs in order (repeats unrolled) and `prefixes` their parameter name
    prefixes (`layers.<i>`, or `<name>.<r>.<key>` inside a repeat); `input_shapes[n]` is one
    sample's shape entering layer n."""

    def __init__(self, input_shape, layers, prefixes=None):
        self.input_shape = tuple(int(v) for v in input_shape)
        self.layers = list(layers)
        self.prefixes = (list(prefixes) if prefixes is not None
                         else [f"layers.{i}" for i in range(len(self.layers))])
        if len(self.prefixes) != len(self.layers) or len(set(self.prefixes)) != len(self.prefixes):
            raise ValueError(f"layer prefixes {self.prefixes} do not name the {len(self.layers)} layers once each")
        self._shapes = {}          # parameter name -> shape, in layer order
        self._relu_weights = set()  # weights whose product a ReLU follows (init_params' scale)
        self.input_shapes = []
        shape = self.input_shape
        for p, layer in zip(self.prefixes, self.layers):
            self.input_shapes.append(shape)
            shape = self._add_layer(p, layer, shape)
        self.output_shape = shape

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config_text: str, sample_x_shape, sample_y_shape=None) -> "Model":
        """Build from the resolved config (YAML text, as `train` writes it into a checkpoint's
        metadata `config`) and one sample's input shape (metadata `input_shape`). When the target
        shape is given, the output must hold as many elements as a target sample."""
        config = yaml.safe_load(config_text) if isinstance(config_text, str) else config_text
        model = config.get("model") or {}
        if "params" in model or "nodes" in model:
            raise NotSupported("explicit params/nodes graphs are not supported by pa_numpy "
                               "(only the layer sugar: linear, attention, mlp, norm, position, repeat)")
        layers, prefixes = [], []
        for prefix, kind, body in expand_layers(model.get("layers")):
            if kind not in PARSERS:
                raise NotSupported(f"{prefix}: layer kind '{kind}' (known: {', '.join(PARSERS)}, repeat)")
            if kind != "norm" and not isinstance(body, dict):
                raise NotSupported(f"{prefix}: {kind}: expected a map, got {body!r}")
            layers.append(PARSERS[kind](body))
            prefixes.append(prefix)
        sample_x_shape = [int(v) for v in sample_x_shape]
        input_shape = model.get("input") or sample_x_shape
        if int(np.prod(input_shape)) != int(np.prod(sample_x_shape)):
            raise ValueError(f"model.input {input_shape} does not hold the {np.prod(sample_x_shape)} "
                             f"elements of a data sample {sample_x_shape}")
        m = cls(input_shape, layers, prefixes)
        if sample_y_shape is not None and int(np.prod(m.output_shape)) != int(np.prod(sample_y_shape)):
            raise ValueError(f"model output {m.output_shape} does not hold a target sample "
                             f"{list(sample_y_shape)}")
        return m

    @classmethod
    def from_metadata(cls, metadata: dict) -> "Model":
        """Build from a model.safetensors metadata dict (config, input_shape, target_shape)."""
        return cls.from_config(metadata["config"], json.loads(metadata["input_shape"]),
                               json.loads(metadata["target_shape"]))

    def _add_layer(self, p, layer, shape):
        def param(what, shp):
            self._shapes[f"{p}.{what}"] = tuple(int(v) for v in shp)

        def block_norms(width, out_width):
            if getattr(layer, "pre_norm", None) is not None:
                param("norm_gain", (width,))
                if layer.pre_norm.kind == "layer":
                    param("norm_bias", (width,))
            if getattr(layer, "post_norm", None) is not None:
                param("norm_gain", (out_width,))
                if layer.post_norm.kind == "layer":
                    param("norm_bias", (out_width,))

        if len(shape) < 1:
            raise ValueError(f"{p}: needs an input with a last axis")
        width = shape[-1]
        if isinstance(layer, Linear):
            if layer.residual and layer.units != width:
                raise ValueError(f"{p}: residual linear needs units == input width {width}, got {layer.units}")
            block_norms(width, layer.units)
            param("weight", (width, layer.units))
            if layer.bias:
                param("bias", (layer.units,))
            if layer.activation == "relu":
                self._relu_weights.add(f"{p}.weight")
            return shape[:-1] + (layer.units,)
        if isinstance(layer, Mlp):
            block_norms(width, width)
            if layer.activation == "swiglu":
                param("gate_weight", (width, layer.hidden))
                if layer.bias:
                    param("gate_bias", (layer.hidden,))
            param("up_weight", (width, layer.hidden))
            if layer.bias:
                param("up_bias", (layer.hidden,))
            param("down_weight", (layer.hidden, width))
            if layer.bias:
                param("down_bias", (width,))
            if layer.activation == "relu":
                self._relu_weights.add(f"{p}.up_weight")
            return shape
        if isinstance(layer, Norm):
            param("gain", (width,))
            if layer.kind == "layer":
                param("bias", (width,))
            return shape
        if len(shape) != 2:
            raise ValueError(f"{p}: {type(layer).__name__.lower()} needs a [seq, features] input, got {list(shape)}")
        if isinstance(layer, Position):
            if layer.kind == "learned":
                param("table", shape)
            return shape
        hq, hk, hd = self._heads(layer, width)
        if hq % hk:
            raise ValueError(f"{p}: kv_heads {hk} does not divide heads {hq}")
        if layer.rope is not None:
            rd = rope_dims(layer, hd)
            if rd % 2 or rd > hd:
                raise ValueError(f"{p}: rope dims {rd} must be even and at most the head dim {hd}")
        block_norms(width, width)
        for name, shp, is_bias in (("q_weight", (width, hq * hd), False), ("q_bias", (hq * hd,), True),
                                   ("k_weight", (width, hk * hd), False), ("k_bias", (hk * hd,), True),
                                   ("v_weight", (width, hk * hd), False), ("v_bias", (hk * hd,), True),
                                   ("o_weight", (hq * hd, width), False), ("o_bias", (width,), True)):
            if layer.bias or not is_bias:
                param(name, shp)
        if layer.sink_logits:
            param("sink_logits", (hq,))
        return shape

    @staticmethod
    def _heads(layer: Attention, width: int):
        hq = layer.heads
        hk = layer.kv_heads or hq
        if layer.head_dim is not None:
            hd = layer.head_dim
        else:
            if width % hq:
                raise ValueError(f"attention: heads {hq} do not divide the width {width}")
            hd = width // hq
        return hq, hk, hd

    def heads(self, n: int):
        """(heads, kv_heads, head_dim) of attention layer n."""
        return self._heads(self.layers[n], self.input_shapes[n][-1])

    # -- parameters ---------------------------------------------------------------------------

    def param_shapes(self) -> dict:
        """Parameter name -> shape (a tuple), as the graph names them."""
        return dict(self._shapes)

    def init_params(self, seed: int) -> dict:
        """Seeded random weights of every parameter, as float32 arrays.

        Not the project's initialisation: weights are scaled normal draws (std 1/sqrt(fan_in),
        sqrt(2/fan_in) before a ReLU, so activations stay O(1) at any width), and biases, norm
        gains (1 + noise), learned position tables and sink logits are non-trivial on purpose, so
        that one that is misplaced or dropped changes the result. float32, so `train` (which
        stores float32) holds exactly these values.
        """
        rng = np.random.default_rng(seed)
        params = {}
        for name, shape in self._shapes.items():
            what = name.rsplit(".", 1)[1]
            if what.endswith("weight"):
                fan_in = shape[0]
                std = math.sqrt((2.0 if name in self._relu_weights else 1.0) / fan_in)
                params[name] = rng.normal(0.0, std, size=shape)
            elif what == "sink_logits":
                params[name] = rng.normal(0.0, 1.0, size=shape)
            elif what in ("gain", "norm_gain"):
                params[name] = 1.0 + rng.normal(0.0, 0.2, size=shape)
            elif what == "table":
                params[name] = rng.normal(0.0, 0.5, size=shape)
            else:  # biases
                params[name] = rng.normal(0.0, 0.2, size=shape)
        return {k: v.astype(np.float32) for k, v in params.items()}

    def _check_params(self, params: dict) -> None:
        missing = [n for n in self._shapes if n not in params]
        extra = [n for n in params if n not in self._shapes]
        if missing or extra:
            raise KeyError(f"parameters: missing {missing}, unexpected {extra}")
        for n, shp in self._shapes.items():
            if tuple(params[n].shape) != shp:
                raise ValueError(f"parameter {n}: shape {list(params[n].shape)}, expected {list(shp)}")

    # -- forward ------------------------------------------------------------------------------

    def forward(self, params: dict, x: np.ndarray) -> np.ndarray:
        """The prediction [B, *output_shape] for x [B, *sample_x], in float64."""
        return self._run(params, x, with_scale=False)[0]

    def forward_with_error_scale(self, params: dict, x: np.ndarray):
        """(prediction, scale): the float64 prediction and, per element, the one-sigma size of the
        error of a float32 evaluation of the same model on the same (float32) inputs and weights
        (module docstring: "Note on the float32 error scale")."""
        return self._run(params, x, with_scale=True)

    def _run(self, params, x, with_scale):
        self._check_params(params)
        x = np.asarray(x, dtype=np.float64)
        h = x.reshape((x.shape[0],) + self.input_shape)
        # The error scale is an estimate, so it is carried in float32 (twice the speed of float64
        # in the matrix products; the values themselves stay float64). Inputs are float32 values,
        # held exactly: their scale starts at 0.
        s = np.zeros(h.shape, np.float32) if with_scale else None
        P = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
        for p, layer in zip(self.prefixes, self.layers):
            h, s = self._layer(p, layer, h, s, P)
        return h, (None if s is None else s.astype(np.float64))

    def _layer(self, p, layer, h, s, P):
        if isinstance(layer, Norm):
            return self._norm(h, s, layer, P[p + ".gain"], P.get(p + ".bias"))
        if isinstance(layer, Position):
            table = P[p + ".table"] if layer.kind == "learned" else sinusoid_table(h.shape[1], h.shape[2])
            out = h + table
            s_out = None
            if s is not None:  # the add, and a computed table's own float32 rounding
                s_out = s + _f32(U32 * np.abs(out))
                if layer.kind == "sinusoidal":
                    s_out = s_out + _f32(U32 * np.abs(table))
            return out, s_out
        if isinstance(layer, Linear):
            body = lambda x, sx: self._linear(x, sx, P[p + ".weight"], P.get(p + ".bias"), layer.activation)
        elif isinstance(layer, Mlp):
            body = lambda x, sx: self._mlp(x, sx, layer, P, p)
        else:
            body = lambda x, sx: self._attention(x, sx, layer, P, p)
        return self._block(h, s, layer, P, p, body)

    def _block(self, x, s, layer, P, p, body):
        """pre_norm -> body -> residual add of the block's input -> post_norm."""
        h, sh = x, s
        if layer.pre_norm is not None:
            h, sh = self._norm(x, s, layer.pre_norm, P[p + ".norm_gain"], P.get(p + ".norm_bias"))
        out, s_out = body(h, sh)
        if layer.residual:
            out = out + x
            if s_out is not None:  # in quadrature: see the module docstring (residual)
                s_out = np.sqrt(s_out * s_out + s * s) + _f32(U32 * np.abs(out))
        if layer.post_norm is not None:
            out, s_out = self._norm(out, s_out, layer.post_norm, P[p + ".norm_gain"], P.get(p + ".norm_bias"))
        return out, s_out

    @staticmethod
    def _norm(x, s, spec, gain, bias):
        """LayerNorm ((x - mean) / sqrt(var + eps), biased variance) or RMSNorm (x / sqrt(mean(x^2)
        + eps)) over the last axis, times gain (plus bias for layer), and the error scale.

        Scale: z_i's first-order error from x's is (dx_i - mean(dx) - z_i mean(z dx)) / sigma
        (layer; rms: (dx_i - z_i mean(z dx)) / rms); with independent dx_j of size s_j its variance
        is at most (s_i^2 + sum_j s_j^2 (1 + z_i z_j)^2 / F^2) / sigma^2 (rms: (s_i^2 + z_i^2
        sum_j s_j^2 z_j^2 / F^2) / rms^2), dropping the negative cross term; the F-term sums of the mean and variance add sqrt(F) u relative to
        sigma (layer: also sqrt(F) u mean|x| / sigma for the mean's cancellation, and mean^2/var
        for a one-pass variance)."""
        f = x.shape[-1]
        if spec.kind == "layer":
            mu = x.mean(axis=-1, keepdims=True)
            xc = x - mu
            var = (xc * xc).mean(axis=-1, keepdims=True)
        else:
            mu, xc = 0.0, x
            var = (x * x).mean(axis=-1, keepdims=True)
        r = 1.0 / np.sqrt(var + spec.eps)
        z = xc * r
        y = z * gain + (bias if bias is not None else 0.0)
        if s is None:
            return y, None
        r32, z32 = _f32(r), _f32(z)
        s2 = s * s
        c = (s2 * z32 * z32).sum(axis=-1, keepdims=True)
        if spec.kind == "layer":
            a = s2.sum(axis=-1, keepdims=True)
            b = (s2 * z32).sum(axis=-1, keepdims=True)
            prop = (s2 + (a + 2 * z32 * b + z32 * z32 * c) / _f32(f * f)) * r32 * r32
        else:
            prop = (s2 + z32 * z32 * c / _f32(f * f)) * r32 * r32
        rnd = _f32(U32 * (math.sqrt(f) + 4.0)) * np.abs(z32)
        if spec.kind == "layer":
            rnd = (rnd * _f32(1.0 + mu * mu / (var + spec.eps))
                   + _f32(U32 * math.sqrt(f + 1.0)) * _f32(np.abs(x).mean(axis=-1, keepdims=True)) * r32)
        s_z = np.sqrt(prop + rnd * rnd)
        s_y = _f32(np.abs(gain)) * s_z + _f32(U32 * (np.abs(z * gain) + np.abs(y)))
        return y, s_y

    @staticmethod
    def _linear(x, s, w, b, activation):
        """act(x @ w + b) on the last axis, and its error scale when s (x's) is given."""
        y = x @ w
        if b is not None:
            y = y + b
        s_out = None
        if s is not None:
            k = w.shape[0] + (1 if b is not None else 0)
            mag = _f32(np.abs(x)) @ _f32(np.abs(w))
            if b is not None:
                mag = mag + _f32(np.abs(b))
            s_out = np.sqrt((s * s) @ _f32(w * w) + _f32(k * U32 * U32) * mag * mag)
        f, lipschitz, ulps = ACTIVATIONS[activation]
        out = f(y)
        if s_out is not None and activation != "none":
            s_out = _f32(lipschitz) * s_out + _f32(ulps * U32 * np.abs(out))
        return out, s_out

    def _mlp(self, x, s, layer: Mlp, P, p):
        """up (and gate) projection, activation, down projection back to the width."""
        bias = (lambda n: P[p + n]) if layer.bias else (lambda n: None)
        if layer.activation == "swiglu":
            g, sg = self._linear(x, s, P[p + ".gate_weight"], bias(".gate_bias"), "silu")
            u, su = self._linear(x, s, P[p + ".up_weight"], bias(".up_bias"), "none")
            h = g * u
            sh = None
            if s is not None:
                sh = _f32(np.abs(u)) * sg + _f32(np.abs(g)) * su + _f32(U32 * np.abs(h))
        else:
            h, sh = self._linear(x, s, P[p + ".up_weight"], bias(".up_bias"), layer.activation)
        return self._linear(h, sh, P[p + ".down_weight"], bias(".down_bias"), "none")

    def _attention(self, x, s, layer: Attention, P, p):
        """Multi-head attention over x [B, S, d] with the mask, GQA, rotary positions, sinks and
        sink logits (the block's norms and residual are _block's)."""
        bsz, seq, width = x.shape
        hq, hk, hd = self._heads(layer, width)
        group = hq // hk
        bias = (lambda n: P[p + n]) if layer.bias else (lambda n: None)

        def split(t, n):  # [B, S, n*hd] -> [B, S, n, hd]
            return t.reshape(bsz, seq, n, hd)

        def heads(t):  # [B, S, n, hd] -> [B, n, S, hd]
            return t.transpose(0, 2, 1, 3)

        def t(a):  # transpose the last two axes
            return a.transpose(0, 1, 3, 2)

        q, sq = self._linear(x, s, P[p + ".q_weight"], bias(".q_bias"), "none")
        k, sk = self._linear(x, s, P[p + ".k_weight"], bias(".k_bias"), "none")
        v, sv = self._linear(x, s, P[p + ".v_weight"], bias(".v_bias"), "none")
        q, k, v = split(q, hq), split(k, hk), split(v, hk)
        if s is not None:
            sq, sk, sv = split(sq, hq), split(sk, hk), split(sv, hk)
        if layer.rope is not None:
            q, sq = apply_rope(q, layer.rope, hd, sq)
            k, sk = apply_rope(k, layer.rope, hd, sk)
        kv_of = np.arange(hq) // group  # query head h reads KV head h // (heads / kv_heads)
        q, k, v = heads(q), heads(k)[:, kv_of], heads(v)[:, kv_of]
        scale = 1.0 / math.sqrt(hd)
        scores = (q @ t(k)) * scale
        vis = attention_visible(layer, seq)
        sink = P[p + ".sink_logits"] if layer.sink_logits else None
        prob = softmax_with_sink(scores, vis, sink)
        o = prob @ v                                           # [B, Hq, S, hd]
        merged = o.transpose(0, 2, 1, 3).reshape(bsz, seq, hq * hd)
        s_merged = None
        if s is not None:
            sq, sk, sv = heads(sq), heads(sk)[:, kv_of], heads(sv)[:, kv_of]
            q32, k32, v32, p32 = _f32(q), _f32(k), _f32(v), _f32(prob)
            mag_s = np.abs(q32) @ t(np.abs(k32))
            var_s = _f32(scale ** 2) * (sq * sq @ t(k32 * k32) + (q32 * q32) @ t(sk * sk)
                                        + _f32((hd + 1) * U32 * U32) * mag_s * mag_s)
            var_s = np.where(vis, var_s, _f32(0.0))
            m = np.where(vis, scores, -np.inf).max(axis=-1, keepdims=True)
            if sink is not None:
                m = np.maximum(m, sink[None, :, None, None])
            m = np.where(np.isfinite(m), m, 0.0)
            tiles = math.ceil(seq / 64)
            r2 = _f32(U32 ** 2 * ((np.abs(np.where(vis, scores, 0.0)) + np.abs(m)) ** 2
                                  + seq + 4 * tiles + 8))
            p2 = p32 * p32
            var_p = p2 * (var_s + (p2 * var_s).sum(axis=-1, keepdims=True) + r2)
            mag_o = p32 @ np.abs(v32)
            var_o = var_p @ (v32 * v32) + p2 @ (sv * sv) + _f32(seq * U32 * U32) * mag_o * mag_o
            s_merged = np.sqrt(var_o).transpose(0, 2, 1, 3).reshape(bsz, seq, hq * hd)
        return self._linear(merged, s_merged, P[p + ".o_weight"], bias(".o_bias"), "none")


# ---------------------------------------------------------------------------------------------

def step_flops(model, batch):
    """The analytic FLOPs of one training step (forward + backward) of pa_numpy model `model` at
    batch size `batch`: 6 * (weight-matrix parameters) * tokens for the matrix products (2 forward,
    4 backward: dX and dW), plus, per attention layer, 4 * B * H * D * (visible query-key pairs)
    forward (QK^T and PV, 2 FLOPs a multiply-add) times 3.5 for forward + backward (the backward's
    five products, FlashAttention's recomputed QK^T among them, as its papers count; the C++
    counterpart is codegen/flops.h). Tokens are B * (the positions of a layer's input: S for
    [S, F], 1 for a flat sample); elementwise work (norms, activations, softmax, Adam) is not
    counted."""
    total = 0
    shapes = model.param_shapes()
    for spec, prefix, shape in zip(model.layers, model.prefixes, model.input_shapes):
        tokens = batch * int(np.prod(shape[:-1]))
        for name, shp in shapes.items():
            if name.startswith(prefix + ".") and name.endswith("weight") and len(shp) == 2:
                total += 6 * shp[0] * shp[1] * tokens
        if isinstance(spec, Attention):
            hq, _, hd = Model._heads(spec, shape[-1])
            pairs = int(attention_visible(spec, shape[0]).sum())
            total += 7 * 2 * batch * hq * hd * pairs  # 3.5 * 4
    return total


def mse(pred: np.ndarray, y: np.ndarray) -> float:
    """Mean over every element of (pred - y)^2, y reshaped to pred's shape, in float64."""
    pred = np.asarray(pred, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(pred.shape)
    return float(np.mean((pred - y) ** 2))


def mse_error_scale(pred: np.ndarray, scale: np.ndarray, y: np.ndarray) -> float:
    """The one-sigma error of a float32 MSE given the prediction's error scale.

    The prediction's errors enter as mean(2 |pred - y| s), added linearly (the elements of one
    sample share their errors, so no sqrt(N) is claimed); the subtraction, square and N-term mean
    add sqrt(N + 3) u * mse.
    """
    pred = np.asarray(pred, dtype=np.float64)
    diff = np.abs(pred - np.asarray(y, dtype=np.float64).reshape(pred.shape))
    return float(np.mean(2.0 * diff * scale) + math.sqrt(pred.size + 3) * U32 * np.mean(diff ** 2))
