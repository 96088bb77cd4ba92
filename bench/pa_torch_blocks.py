"""PyTorch modules for PureAttention's layer vocabulary, shared by bench/torch_mirror.py (the fp32
trajectory mirror) and bench/train_vs_torch.py (the step-time comparison).

    model = build(pn_model, attention="explicit" | "auto")
    model.load_pa(tensors)          # our checkpoint tensors by name (weights transposed)
    model.pa_grads()                # gradients by our names, in our layout

`pn_model` is a tests/interop/pa_numpy.Model (the config parsed once, repeats unrolled, every
layer with its parameter prefix). Each layer kind is one module here, written from the README and
the layer specification, not from the C++ code:
- linear / mlp / attention are residual blocks: pre_norm -> body -> (+ the block's input) ->
  post_norm, norm parameters `<p>.norm_gain`, `<p>.norm_bias`;
- norm: F.layer_norm (biased variance, as ours) or RMSNorm x * rsqrt(mean(x^2) + eps) * gain;
- position: a learned [S, F] table, or the sinusoidal one (computed in float64 by pa_numpy and
  rounded once to the model's dtype);
- rotary positions: cos/sin tables in float64 (pa_numpy.rope_tables) rounded once, applied to q
  and k as [B, S, H, D] before the head transpose, half-split (HF rotate_half) or interleaved;
- attention, two formulations:
    "explicit": q k^T / sqrt(D), the boolean mask of README "Attention masks" as -inf, the sink
      logit as an extra softmax column dropped after the softmax, p v. Exact to fp32, and the only
      one that knows sink logits.
    "auto": F.scaled_dot_product_attention where PyTorch supports the mask: no mask, is_causal
      (a causal mask without window), or a boolean attn_mask (windows, StreamingLLM sinks); the
      explicit form where it cannot (sink logits). `formulation` says which, per layer.
  Grouped-query attention: SDPA's enable_gqa=True where this torch has it, else
  repeat_interleave of K and V (query head h reads KV head h // (heads / kv_heads)).
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "interop"))
import pa_numpy as pn  # noqa: E402

ACTS = {
    "none": lambda x: x,
    "relu": F.relu,
    "gelu": lambda x: F.gelu(x, approximate="none"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}


def _sdpa_has_gqa():
    try:
        z = torch.zeros(1, 2, 1, 4)
        F.scaled_dot_product_attention(z, torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


SDPA_GQA = _sdpa_has_gqa()


class Norm(nn.Module):
    """LayerNorm or RMSNorm over the last axis with a gain (and a bias for layer)."""

    def __init__(self, kind, eps, width):
        super().__init__()
        self.kind, self.eps, self.width = kind, float(eps), width
        self.gain = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if kind == "layer" else None

    def forward(self, x):
        if self.kind == "layer":
            return F.layer_norm(x, (self.width,), self.gain, self.bias, self.eps)
        if x.dtype in (torch.float16, torch.bfloat16):  # as autocast's fp32 ops: statistics in fp32
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.gain
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.gain

    def param_map(self, prefix=""):
        m = {prefix + "gain": (self.gain, False)}
        if self.bias is not None:
            m[prefix + "bias"] = (self.bias, False)
        return m


class Position(nn.Module):
    def __init__(self, spec, seq, width):
        super().__init__()
        self.table = None
        if spec.kind == "learned":
            self.table = nn.Parameter(torch.zeros(seq, width))
        else:
            self.register_buffer("fixed", torch.from_numpy(pn.sinusoid_table(seq, width)), persistent=False)

    def forward(self, x):
        return x + (self.table if self.table is not None else self.fixed.to(x.dtype))

    def param_map(self):
        return {"table": (self.table, False)} if self.table is not None else {}


class LinearBody(nn.Module):
    def __init__(self, spec, width):
        super().__init__()
        self.linear = nn.Linear(width, spec.units, bias=spec.bias)
        self.act = ACTS[spec.activation]

    def forward(self, x):
        return self.act(self.linear(x))

    def param_map(self):
        m = {"weight": (self.linear.weight, True)}
        if self.linear.bias is not None:
            m["bias"] = (self.linear.bias, False)
        return m


class MlpBody(nn.Module):
    def __init__(self, spec, width):
        super().__init__()
        self.swiglu = spec.activation == "swiglu"
        self.gate = nn.Linear(width, spec.hidden, bias=spec.bias) if self.swiglu else None
        self.up = nn.Linear(width, spec.hidden, bias=spec.bias)
        self.down = nn.Linear(spec.hidden, width, bias=spec.bias)
        self.act = None if self.swiglu else ACTS[spec.activation]

    def forward(self, x):
        h = F.silu(self.gate(x)) * self.up(x) if self.swiglu else self.act(self.up(x))
        return self.down(h)

    def param_map(self):
        m = {}
        for name, lin in (("gate", self.gate), ("up", self.up), ("down", self.down)):
            if lin is None:
                continue
            m[name + "_weight"] = (lin.weight, True)
            if lin.bias is not None:
                m[name + "_bias"] = (lin.bias, False)
        return m


class AttentionBody(nn.Module):
    def __init__(self, spec, seq, width, impl="explicit"):
        super().__init__()
        self.hq = spec.heads
        self.hk = spec.kv_heads or spec.heads
        self.hd = spec.head_dim or width // spec.heads
        self.q = nn.Linear(width, self.hq * self.hd, bias=spec.bias)
        self.k = nn.Linear(width, self.hk * self.hd, bias=spec.bias)
        self.v = nn.Linear(width, self.hk * self.hd, bias=spec.bias)
        self.o = nn.Linear(self.hq * self.hd, width, bias=spec.bias)
        self.sink_logits = nn.Parameter(torch.zeros(self.hq)) if spec.sink_logits else None
        vis = pn.attention_visible(spec, seq)
        self.visible_pairs = int(vis.sum())
        self.register_buffer("visible", torch.from_numpy(vis), persistent=False)
        self.register_buffer("row_sees", torch.from_numpy(vis.any(axis=1)), persistent=False)
        self.rope = spec.rope
        if self.rope is not None:
            self.rope_dims = self.rope.dims or self.hd
            cos, sin = pn.rope_tables(seq, self.rope_dims, self.rope.base)
            # float64 here: the module's .to(dtype) (build) rounds them once
            self.register_buffer("rope_cos", torch.from_numpy(cos), persistent=False)
            self.register_buffer("rope_sin", torch.from_numpy(sin), persistent=False)
        # The formulation: SDPA where PyTorch supports the mask, else explicit.
        everything = bool(vis.all())
        causal_only = bool((vis == np.tril(np.ones_like(vis))).all())
        if impl == "explicit":
            self.formulation = "explicit"
        elif spec.sink_logits:
            self.formulation = "explicit (sink logits: no SDPA form)"
        elif everything:
            self.formulation = "sdpa"
        elif causal_only:
            self.formulation = "sdpa is_causal"
        else:
            self.formulation = "sdpa attn_mask (window/sinks)"
        self.gqa_native = SDPA_GQA and self.hq != self.hk

    def rotate(self, t):
        """Rotary positions on t [B, S, H, D] (module docstring)."""
        d, half = self.rope_dims, self.rope_dims // 2
        c = self.rope_cos[:, None, :].to(t.dtype)
        s = self.rope_sin[:, None, :].to(t.dtype)
        if self.rope.interleaved:
            a, b = t[..., 0:d:2], t[..., 1:d:2]
            r = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
        else:
            a, b = t[..., :half], t[..., half:d]
            r = torch.cat((a * c - b * s, a * s + b * c), dim=-1)
        return r if d == self.hd else torch.cat((r, t[..., d:]), dim=-1)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.hq, self.hd)
        k = self.k(x).view(b, s, self.hk, self.hd)
        v = self.v(x).view(b, s, self.hk, self.hd).transpose(1, 2)
        if self.rope is not None:
            q, k = self.rotate(q), self.rotate(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        group = self.hq // self.hk  # query head h reads KV head h // group
        if self.formulation.startswith("sdpa"):
            kw = {}
            if self.gqa_native:
                kw["enable_gqa"] = True
            elif group > 1:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            if self.formulation == "sdpa is_causal":
                kw["is_causal"] = True
            elif self.formulation != "sdpa":
                kw["attn_mask"] = self.visible
            out = F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            if group > 1:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            scores = scores.masked_fill(~self.visible, float("-inf"))
            # a row that sees no key: finite scores for the softmax, zeroed after
            scores = scores.masked_fill(~self.row_sees[:, None], 0.0)
            if self.sink_logits is not None:
                sink = self.sink_logits.to(scores.dtype).view(1, self.hq, 1, 1).expand(b, self.hq, s, 1)
                p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            else:
                p = torch.softmax(scores, dim=-1)
            p = p.masked_fill(~self.row_sees[:, None], 0.0)
            out = p.to(v.dtype) @ v
        out = out.transpose(1, 2).reshape(b, s, self.hq * self.hd)
        return self.o(out)

    def param_map(self):
        m = {}
        for name, lin in (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o)):
            m[name + "_weight"] = (lin.weight, True)
            if lin.bias is not None:
                m[name + "_bias"] = (lin.bias, False)
        if self.sink_logits is not None:
            m["sink_logits"] = (self.sink_logits, False)
        return m


class Block(nn.Module):
    """pre_norm -> body -> residual add of the block's input -> post_norm."""

    def __init__(self, spec, body, width, out_width):
        super().__init__()
        self.body = body
        self.residual = spec.residual
        self.pre = Norm(spec.pre_norm.kind, spec.pre_norm.eps, width) if spec.pre_norm else None
        self.post = Norm(spec.post_norm.kind, spec.post_norm.eps, out_width) if spec.post_norm else None

    def forward(self, x):
        h = self.body(self.pre(x) if self.pre is not None else x)
        if self.residual:
            h = x + h
        return self.post(h) if self.post is not None else h

    def param_map(self):
        m = dict(self.body.param_map())
        for n in (self.pre, self.post):
            if n is not None:
                m.update(n.param_map("norm_"))
        return m


class PaModel(nn.Module):
    """The whole model: one module per (unrolled) layer, named by its parameter prefix."""

    def __init__(self, model, attention="explicit"):
        super().__init__()
        self.input_shape = tuple(model.input_shape)
        self.prefixes = list(model.prefixes)
        mods = []
        for spec, shape in zip(model.layers, model.input_shapes):
            width = shape[-1]
            if isinstance(spec, pn.Norm):
                mods.append(Norm(spec.kind, spec.eps, width))
            elif isinstance(spec, pn.Position):
                mods.append(Position(spec, shape[0], width))
            elif isinstance(spec, pn.Linear):
                mods.append(Block(spec, LinearBody(spec, width), width, spec.units))
            elif isinstance(spec, pn.Mlp):
                mods.append(Block(spec, MlpBody(spec, width), width, width))
            elif isinstance(spec, pn.Attention):
                mods.append(Block(spec, AttentionBody(spec, shape[0], width, attention), width, width))
            else:
                raise ValueError(f"no PyTorch module for {spec!r}")
        self.layers = nn.ModuleList(mods)

    def forward(self, x):
        x = x.reshape((x.shape[0],) + self.input_shape)
        for layer in self.layers:
            x = layer(x)
        return x

    def pa_params(self):
        """Our parameter name -> (torch parameter, transposed?) for every parameter."""
        out = {}
        for prefix, mod in zip(self.prefixes, self.layers):
            for what, (p, t) in mod.param_map().items():
                out[f"{prefix}.{what}"] = (p, t)
        mine = {id(p) for p, _ in out.values()}
        stray = [n for n, p in self.named_parameters() if id(p) not in mine]
        if stray:
            raise ValueError(f"mirror parameters with no PureAttention name: {stray}")
        return out

    def load_pa(self, tensors):
        """Copies every checkpoint tensor into the module by name; nothing may be left over on
        either side."""
        targets = self.pa_params()
        missing = sorted(set(targets) - set(tensors))
        extra = sorted(set(tensors) - set(targets))
        if missing or extra:
            raise ValueError(f"checkpoint vs mirror: missing {missing}, unexpected {extra}")
        with torch.no_grad():
            for name, value in tensors.items():
                p, transpose = targets[name]
                t = torch.as_tensor(np.ascontiguousarray(value)).to(p.dtype)
                t = t.t() if transpose else t
                if tuple(p.shape) != tuple(t.shape):
                    raise ValueError(f"{name}: {list(value.shape)} does not fit {list(p.shape)}")
                p.copy_(t)

    def pa_grads(self):
        """Gradients by our names, in our layout (weights [in, out]), as float64 NumPy arrays."""
        out = {}
        for name, (p, transpose) in self.pa_params().items():
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            g = g.detach().t() if transpose else g.detach()
            out[name] = g.double().cpu().numpy()
        return out

    def attention_formulations(self):
        return [f"{pre}: {m.body.formulation}" for pre, m in zip(self.prefixes, self.layers)
                if isinstance(m, Block) and isinstance(m.body, AttentionBody)]


def build(model, attention="explicit", dtype=torch.float32):
    """The PyTorch model of pa_numpy model `model`, parameters and tables in `dtype` (the tables
    are computed in float64 and rounded once)."""
    return PaModel(model, attention).to(dtype)


def step_flops(model, batch):
    """pa_numpy.step_flops (the analytic FLOPs of one training step)."""
    return pn.step_flops(model, batch)
