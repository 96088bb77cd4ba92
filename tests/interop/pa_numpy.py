"""An independent float64 NumPy implementation of PureAttention's layer models.

What: the `model.layers` sugar of a config (README "Model": `linear` and `attention` with every
option: activations, bias, heads, kv_heads (grouped-query), head_dim, causal, align, window,
sinks, sink_logits, residual), built from the resolved config YAML that a checkpoint carries in
its metadata, plus one sample's data shapes. It gives the parameter names and shapes the graph
uses, seeded random weights of those shapes, the forward pass and the MSE loss.

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
- attention parameters are `layers.<i>.{q,k,v,o}_{weight,bias}` and `layers.<i>.sink_logits`;
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
- residual x + a:                 s = s_x + s_a + u |x + a|  (added linearly: the two share errors)
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
    """A model this reference does not implement (explicit params/nodes graphs)."""


def _f32(a):
    """float32 copy, for the error-scale computations (module docstring)."""
    return np.asarray(a, dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Activations: (function, Lipschitz constant, ulps of a float32 evaluation for the error scale).

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    """The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as README says (not tanh's)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


ACTIVATIONS = {
    "none": (lambda x: x, 1.0, 0.0),
    "relu": (lambda x: np.maximum(x, 0.0), 1.0, 0.0),
    # max |gelu'(x)| = 1.1289 (at x = sqrt 2)
    "gelu": (_gelu, 1.13, 8.0),
    "tanh": (np.tanh, 1.0, 4.0),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), 0.25, 4.0),
}


# ---------------------------------------------------------------------------------------------
# Layer specifications, read from the resolved config.

@dataclass(frozen=True)
class Linear:
    """`linear: {units, activation, bias}`: act(x @ W + b) over the last axis."""
    units: int
    activation: str = "none"
    bias: bool = True


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


def _parse_linear(d: dict) -> Linear:
    known = {"units", "activation", "bias"}
    _reject_unknown("linear", d, known)
    act = d.get("activation", "none")
    if act not in ACTIVATIONS:
        raise NotSupported(f"linear.activation '{act}' (known: {', '.join(ACTIVATIONS)})")
    return Linear(units=int(d["units"]), activation=act, bias=bool(d.get("bias", True)))


def _parse_attention(d: dict) -> Attention:
    known = {"heads", "kv_heads", "head_dim", "causal", "align", "window", "sinks", "sink_logits",
             "residual"}
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
                     residual=bool(d.get("residual", False)))


def _reject_unknown(kind: str, d: dict, known: set) -> None:
    # A key this reference does not know would be silently ignored otherwise, and the comparison
    # would then test a different model from the one `train` built.
    unknown = set(d) - known
    if unknown:
        raise NotSupported(f"{kind} keys {sorted(unknown)} (known: {sorted(known)})")


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
# The model.

class Model:
    """A layer-sugar model: parameter shapes, random weights, forward, float32 error scale."""

    def __init__(self, input_shape, layers):
        self.input_shape = tuple(int(v) for v in input_shape)
        self.layers = list(layers)
        self._shapes = {}       # parameter name -> shape, in layer order
        self._relu_next = {}    # layer index -> its activation is ReLU (init_params' scale)
        shape = self.input_shape
        for i, layer in enumerate(self.layers):
            shape = self._add_layer(i, layer, shape)
        self.output_shape = shape

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_config(cls, config_text: str, sample_x_shape, sample_y_shape=None) -> "Model":
        """Build from the resolved config (YAML text, as `train` writes it into a checkpoint's
        metadata `config`) and one sample's input shape (metadata `input_shape`). When the target
        shape is given, the output must hold as many elements as a target sample."""
        config = yaml.safe_load(config_text)
        model = config.get("model") or {}
        if "params" in model or "nodes" in model:
            raise NotSupported("explicit params/nodes graphs are not supported by pa_numpy "
                               "(only the layer sugar: linear and attention)")
        layers = []
        for i, entry in enumerate(model.get("layers") or []):
            if not isinstance(entry, dict) or len(entry) != 1:
                raise NotSupported(f"model.layers[{i}]: expected one kind per layer, got {entry!r}")
            (kind, body), = entry.items()
            body = body or {}
            if kind == "linear":
                layers.append(_parse_linear(body))
            elif kind == "attention":
                layers.append(_parse_attention(body))
            else:
                raise NotSupported(f"model.layers[{i}]: layer kind '{kind}'")
        sample_x_shape = [int(v) for v in sample_x_shape]
        input_shape = model.get("input") or sample_x_shape
        if int(np.prod(input_shape)) != int(np.prod(sample_x_shape)):
            raise ValueError(f"model.input {input_shape} does not hold the {np.prod(sample_x_shape)} "
                             f"elements of a data sample {sample_x_shape}")
        m = cls(input_shape, layers)
        if sample_y_shape is not None and int(np.prod(m.output_shape)) != int(np.prod(sample_y_shape)):
            raise ValueError(f"model output {m.output_shape} does not hold a target sample "
                             f"{list(sample_y_shape)}")
        return m

    @classmethod
    def from_metadata(cls, metadata: dict) -> "Model":
        """Build from a model.safetensors metadata dict (config, input_shape, target_shape)."""
        return cls.from_config(metadata["config"], json.loads(metadata["input_shape"]),
                               json.loads(metadata["target_shape"]))

    def _add_layer(self, i, layer, shape):
        p = f"layers.{i}."
        if isinstance(layer, Linear):
            if len(shape) < 1:
                raise ValueError(f"layers.{i}: linear needs an input with a last axis")
            self._shapes[p + "weight"] = (shape[-1], layer.units)
            if layer.bias:
                self._shapes[p + "bias"] = (layer.units,)
            self._relu_next[i] = layer.activation == "relu"
            return shape[:-1] + (layer.units,)
        if len(shape) != 2:
            raise ValueError(f"layers.{i}: attention needs a [seq, features] input, got {list(shape)}")
        width = shape[1]
        hq, hk, hd = self._heads(layer, width)
        if hq % hk:
            raise ValueError(f"layers.{i}: kv_heads {hk} does not divide heads {hq}")
        for name, shp in (("q_weight", (width, hq * hd)), ("q_bias", (hq * hd,)),
                          ("k_weight", (width, hk * hd)), ("k_bias", (hk * hd,)),
                          ("v_weight", (width, hk * hd)), ("v_bias", (hk * hd,)),
                          ("o_weight", (hq * hd, width)), ("o_bias", (width,))):
            self._shapes[p + name] = shp
        if layer.sink_logits:
            self._shapes[p + "sink_logits"] = (hq,)
        self._relu_next[i] = False
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

    # -- parameters ---------------------------------------------------------------------------

    def param_shapes(self) -> dict:
        """Parameter name -> shape (a tuple), as the graph names them."""
        return dict(self._shapes)

    def init_params(self, seed: int) -> dict:
        """Seeded random weights of every parameter, as float32 arrays.

        Not the project's initialisation: weights are scaled normal draws (std 1/sqrt(fan_in),
        sqrt(2/fan_in) before a ReLU, so activations stay O(1) at any width), and biases and sink
        logits are non-zero on purpose, so that a bias or sink logit that is misplaced or dropped
        changes the result. float32, so `train` (which stores float32) holds exactly these values.
        """
        rng = np.random.default_rng(seed)
        params = {}
        for name, shape in self._shapes.items():
            layer = int(name.split(".")[1])
            if name.endswith("weight"):
                fan_in = shape[0]
                std = math.sqrt((2.0 if self._relu_next[layer] else 1.0) / fan_in)
                params[name] = rng.normal(0.0, std, size=shape)
            elif name.endswith("sink_logits"):
                params[name] = rng.normal(0.0, 1.0, size=shape)
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
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            if isinstance(layer, Linear):
                h, s = self._linear(h, s, P[p + "weight"], P.get(p + "bias"), layer.activation)
            else:
                h, s = self._attention(h, s, layer, P, p)
        return h, (None if s is None else s.astype(np.float64))

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

    def _attention(self, x, s, layer: Attention, P, p):
        """Multi-head attention over x [B, S, d] with the mask, GQA, sinks and sink logits."""
        bsz, seq, width = x.shape
        hq, hk, hd = self._heads(layer, width)
        group = hq // hk

        def heads(t, n):  # [B, S, n*hd] -> [B, n, S, hd]
            return t.reshape(bsz, seq, n, hd).transpose(0, 2, 1, 3)

        def t(a):  # transpose the last two axes
            return a.transpose(0, 1, 3, 2)

        q, sq = self._linear(x, s, P[p + "q_weight"], P[p + "q_bias"], "none")
        k, sk = self._linear(x, s, P[p + "k_weight"], P[p + "k_bias"], "none")
        v, sv = self._linear(x, s, P[p + "v_weight"], P[p + "v_bias"], "none")
        kv_of = np.arange(hq) // group  # query head h reads KV head h // (heads / kv_heads)
        q, k, v = heads(q, hq), heads(k, hk)[:, kv_of], heads(v, hk)[:, kv_of]
        scale = 1.0 / math.sqrt(hd)
        scores = (q @ t(k)) * scale
        vis = visible(seq, seq, layer.causal, layer.align, layer.window_left, layer.window_right,
                      layer.sinks)
        sink = P[p + "sink_logits"] if layer.sink_logits else None
        prob = softmax_with_sink(scores, vis, sink)
        o = prob @ v                                           # [B, Hq, S, hd]
        merged = o.transpose(0, 2, 1, 3).reshape(bsz, seq, hq * hd)
        s_merged = None
        if s is not None:
            sq, sk, sv = heads(sq, hq), heads(sk, hk)[:, kv_of], heads(sv, hk)[:, kv_of]
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
        out, s_out = self._linear(merged, s_merged, P[p + "o_weight"], P[p + "o_bias"], "none")
        if layer.residual:
            out = out + x
            if s_out is not None:
                s_out = s_out + s + _f32(U32 * np.abs(out))
        return out, s_out


# ---------------------------------------------------------------------------------------------

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
