#!/usr/bin/env python3
"""Times PureAttention's flash attention kernels and PyTorch side by side, in one process and run.

Loads build/bench/libpa_flash_bench.so (ctypes), hands it torch tensors' data pointers and the
current stream, and times both sides in GPU time with the host's overhead hidden (bench(): a spin
kernel holds the stream while many calls are queued behind it, one CUDA event pair around them,
median of five such windows), on inputs rotating through more memory than the L2 cache holds.
Shapes follow ../shared/anchors-pytorch-h100.md. Prints markdown tables with TFLOP/s and ratios.

usage: attention_vs_torch.py [--lib PATH] [--quick] [--only anchors,gqa,fp32,tinyllama,headdims|probe|probe128|gqaprobe|tune|bwdtune|gqatune|f32bwd|f32bwdgrid|f32split|f32splitcausal]
                             [--out FILE] [--dims 64,128] [--seqs 4096] [--anchor-seqs 8192,16384]
"""
import argparse
import ctypes
import itertools
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class Flash:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.err = ctypes.create_string_buffer(4096)
        self.lib.paFlashBackwardWorkspace.restype = ctypes.c_ulonglong
        if self.lib.paFlashInit(self.err, 4096) != 0:
            raise RuntimeError(self.err.value.decode())

    @staticmethod
    def _p(t):
        return ctypes.c_void_p(t.data_ptr() if t is not None else 0)

    def _mask(self, causal, window, sinks):
        wl, wr = window
        return [ctypes.c_int(int(causal)), ctypes.c_int(0), ctypes.c_int(wl), ctypes.c_int(wr), ctypes.c_int(sinks)]

    def forward_args(self, q, k, v, o, lse, causal=False, window=(-1, -1), sinks=0, sink_logits=None):
        """ctypes arguments of one forward call, built once so that timing sees the launch, not Python."""
        b, hq, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        return (DT[q.dtype], b, hq, hkv, sq, sk, d, ctypes.c_float(1.0 / math.sqrt(d)), *self._mask(causal, window, sinks),
                self._p(q), self._p(k), self._p(v), self._p(o), self._p(lse), self._p(sink_logits),
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), self.err, 4096)

    def backward_args(self, q, k, v, o, do, dq, dk, dv, lse, ws, causal=False, window=(-1, -1), sinks=0,
                      sink_logits=None, dsink=None):
        b, hq, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        return (DT[q.dtype], b, hq, hkv, sq, sk, d, ctypes.c_float(1.0 / math.sqrt(d)), *self._mask(causal, window, sinks),
                self._p(q), self._p(k), self._p(v), self._p(o), self._p(do), self._p(dq), self._p(dk), self._p(dv),
                self._p(lse), self._p(sink_logits), self._p(dsink), self._p(ws),
                ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), self.err, 4096)

    def forward(self, args):
        if self.lib.paFlashForward(*args):
            raise RuntimeError(self.err.value.decode())

    def backward(self, args):
        if self.lib.paFlashBackward(*args):
            raise RuntimeError(self.err.value.decode())

    def workspace(self, q, k, causal=False, window=(-1, -1), sinks=0):
        """Bytes for the backward of this problem and mask (GQA's dK/dV scheme depends on the mask)."""
        b, hq, sq, d = q.shape
        n = self.lib.paFlashBackwardWorkspace(DT[q.dtype], b, hq, k.shape[1], sq, k.shape[2], d,
                                              *self._mask(causal, window, sinks))
        return torch.empty(n, dtype=torch.uint8, device=q.device)


L2_BYTES = 50 << 20  # the H100's L2


def sets_for(nbytes):
    """How many input sets rotate through twice the L2's bytes when one set holds nbytes."""
    return max(2, min(64, -(-2 * L2_BYTES // max(nbytes, 1))))


def bench(fns, windows=5):
    """GPU time of one call in ms, host overhead hidden on both sides. A spin kernel
    (torch.cuda._sleep) holds the stream while `calls` calls are queued behind it, rotating through
    `fns` (one closure per input set, so that the inputs come from beyond L2), and one CUDA event
    pair times them back to back; the median over `windows` windows. A window whose start event
    fired before the host finished queueing (the spin was too short, or the launch queue filled)
    is retried with a longer spin and fewer calls."""
    fns = [fns] if callable(fns) else list(fns)
    for f in fns:  # warm-up: compiles, autotunes, allocates
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(2 * len(fns)):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / (2 * len(fns))  # s, bounds both the host's and the device's time
    calls = max(len(fns), 30)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, spin_s, retries = [], 2 * per_call * calls, 0  # the first spin: twice the synchronous time
    while len(times) < windows:
        torch.cuda._sleep(int(spin_s * 2.0e9) + 2_000_000)  # cycles; the SM clock is below 2 GHz
        start.record()
        h0 = time.perf_counter()
        for i in range(calls):
            fns[i % len(fns)]()
        host_s = time.perf_counter() - h0
        queued_in_time = not start.query()
        end.record()
        torch.cuda.synchronize()
        if queued_in_time:
            times.append(start.elapsed_time(end) / calls)
            spin_s = 1.5 * host_s  # the next spins: just past the host's queueing
        else:
            spin_s, calls, retries = 2 * max(spin_s, host_s), max(4, calls // 2), retries + 1
            if retries > 6:
                raise RuntimeError("bench: the host cannot queue the calls ahead of the device")
    return statistics.median(times)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def qkv(b, hq, hk, s, d, dt):
    return (torch.randn(b, hq, s, d, device="cuda", dtype=dt), torch.randn(b, hk, s, d, device="cuda", dtype=dt),
            torch.randn(b, hk, s, d, device="cuda", dtype=dt))


def input_sets(fl, b, hq, hk, s, d, dt, **mask):
    """Ours objects on fresh random inputs, as many as bench() needs to rotate beyond L2 (q, k, v,
    O, dO, the gradients, PyTorch's copies: about 12 tensors of the problem's size)."""
    nbytes = 12 * b * hq * s * d * torch.tensor([], dtype=dt).element_size()
    return [Ours(fl, *qkv(b, hq, hk, s, d, dt), **mask) for _ in range(sets_for(nbytes))]


class Ours:
    """Buffers and closures for one problem."""

    def __init__(self, fl, q, k, v, **mask):
        self.fl, self.q, self.k, self.v, self.mask = fl, q, k, v, mask
        b, hq, sq, d = q.shape
        self.o = torch.empty_like(q)
        self.lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
        self.do = torch.randn_like(q)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.ws = fl.workspace(q, k, **mask)
        self.fa = fl.forward_args(q, k, v, self.o, self.lse, **mask)
        self.ba = fl.backward_args(q, k, v, self.o, self.do, self.dq, self.dk, self.dv, self.lse, self.ws, **mask)

    def fwd(self):
        self.fl.forward(self.fa)

    def fwd_bwd(self):
        self.fl.forward(self.fa)
        self.fl.backward(self.ba)


def torch_fns(q, k, v, do, causal, backend):
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def fwd():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        out.backward(do)
        qg.grad = kg.grad = vg.grad = None

    return fwd, fwd_bwd


def sdpa_default_fns(o):
    """PyTorch's SDPA with its default backend choice (fp32: the efficient or math kernels)."""
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (o.q, o.k, o.v))

    def fwd():
        return F.scaled_dot_product_attention(o.q, o.k, o.v)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(qg, kg, vg)
        out.backward(o.do)
        qg.grad = kg.grad = vg.grad = None

    return fwd, fwd_bwd


def anchors(fl, quick, lines, dims=(64, 128), seqs=None):
    lines.append("\n## bf16 SDPA anchors (b*s = 16384, h*d = 2048), TFLOP/s; ratio = ours / PyTorch\n")
    lines.append("| d | s | causal | ours fwd | flash fwd | cudnn fwd | ours/flash fwd | ours/cudnn fwd "
                 "| ours f+b | flash f+b | cudnn f+b | ours/flash f+b | ours/cudnn f+b | max rel err O vs SDPA |")
    lines.append("|" + "---|" * 14)
    seqs = seqs or ([1024, 4096, 16384] if quick else [1024, 2048, 4096, 8192, 16384])
    for d in dims:
        for s in seqs:
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                sets = input_sets(fl, b, h, h, s, d, torch.bfloat16, causal=causal)
                ours = sets[0]
                q, k, v = ours.q, ours.k, ours.v
                fl_f = 4 * b * h * s * s * d / (2 if causal else 1)
                t = {}
                t["ours_f"] = bench([o.fwd for o in sets])
                t["ours_fb"] = bench([o.fwd_bwd for o in sets])
                for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    fns = [torch_fns(o.q, o.k, o.v, o.do, causal, be) for o in sets]
                    try:
                        t[name + "_f"] = bench([f for f, _ in fns])
                        t[name + "_fb"] = bench([fb for _, fb in fns])
                    except RuntimeError as e:  # a backend may refuse a shape
                        print(f"{name} failed: {e}", file=sys.stderr)
                        t[name + "_f"] = t[name + "_fb"] = float("nan")
                ours.fwd()
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                err = rel_err(ours.o, ref)
                tf = {key: (fl_f * (3.5 if key.endswith("fb") else 1)) / (ms * 1e-3) / 1e12 for key, ms in t.items()}
                lines.append(
                    f"| {d} | {s} | {causal} | {tf['ours_f']:.0f} | {tf['flash_f']:.0f} | {tf['cudnn_f']:.0f} | "
                    f"{tf['ours_f'] / tf['flash_f']:.2f} | {tf['ours_f'] / tf['cudnn_f']:.2f} | {tf['ours_fb']:.0f} | "
                    f"{tf['flash_fb']:.0f} | {tf['cudnn_fb']:.0f} | {tf['ours_fb'] / tf['flash_fb']:.2f} | "
                    f"{tf['ours_fb'] / tf['cudnn_fb']:.2f} | {err:.1e} |")
                print(lines[-1], flush=True)
                del q, k, v, ours, sets, fns


def head_dims(fl, lines, dims):
    """bf16 at head dims `dims` (16, 32 and 96 unless --headdims; b*s = 16384, h = 2048 // d): the
    sm_90a default (wgmma where the rule puts it, the head dim padded) against the mma.sync kernels
    at the head dim (PA_FLASH_WGMMA=0) and PyTorch's cuDNN backend. ms; ratios > 1: the default faster."""
    lines.append(f"\n## bf16 head dims {', '.join(map(str, dims))}, ms; ratio = other / default (>1: the default faster)\n")
    lines.append("| d | s | causal | default fwd | mma.sync fwd | cudnn fwd | mma.sync/default | cudnn/default "
                 "| default f+b | mma.sync f+b | cudnn f+b | mma.sync/default f+b | cudnn/default f+b | rel err O vs SDPA |")
    lines.append("|" + "---|" * 14)
    for d in dims:
        for s in (1024, 4096):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                sets = input_sets(fl, b, h, h, s, d, torch.bfloat16, causal=causal)
                t = {}
                for mode in ("1", "0"):
                    os.environ["PA_FLASH_WGMMA"] = mode
                    t["f" + mode] = bench([o.fwd for o in sets])
                    t["fb" + mode] = bench([o.fwd_bwd for o in sets])
                del os.environ["PA_FLASH_WGMMA"]
                fns = [torch_fns(o.q, o.k, o.v, o.do, causal, SDPBackend.CUDNN_ATTENTION) for o in sets]
                try:
                    t["cf"], t["cfb"] = bench([f for f, _ in fns]), bench([fb for _, fb in fns])
                except RuntimeError as e:  # a backend may refuse a shape
                    print(f"cudnn failed: {e}", file=sys.stderr)
                    t["cf"] = t["cfb"] = float("nan")
                ours = sets[0]
                ours.fwd()
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    ref = F.scaled_dot_product_attention(ours.q, ours.k, ours.v, is_causal=causal)
                err = rel_err(ours.o, ref)
                lines.append(f"| {d} | {s} | {causal} | {t['f1']:.4f} | {t['f0']:.4f} | {t['cf']:.4f} | {t['f0'] / t['f1']:.2f} | "
                             f"{t['cf'] / t['f1']:.2f} | {t['fb1']:.4f} | {t['fb0']:.4f} | {t['cfb']:.4f} | "
                             f"{t['fb0'] / t['fb1']:.2f} | {t['cfb'] / t['fb1']:.2f} | {err:.1e} |")
                print(lines[-1], flush=True)
                del ours, sets, fns


def gqa_masks(fl, lines):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    lines.append("\n## GQA b4 hq16 hk4 s4096 d128 bf16, ms; ratio = FlexAttention time / ours (>1: ours faster)\n")
    lines.append("| mask | ours fwd | flex fwd | speedup fwd | ours f+b | flex f+b | speedup f+b | rel err O vs flex |")
    lines.append("|---|---|---|---|---|---|---|---|")
    b, hq, hk, s, d = 4, 16, 4, 4096, 128
    flex = torch.compile(flex_attention)
    cases = {
        "causal": (dict(causal=True), lambda bb, h, qi, ki: qi >= ki),
        "swa1024": (dict(causal=True, window=(1023, -1)), lambda bb, h, qi, ki: (qi >= ki) & (qi - ki <= 1023)),
        "swa1024_sink4": (dict(causal=True, window=(1023, -1), sinks=4),
                          lambda bb, h, qi, ki: (qi >= ki) & ((qi - ki <= 1023) | (ki < 4))),
    }
    for name, (mask, mod) in cases.items():
        sets = input_sets(fl, b, hq, hk, s, d, torch.bfloat16, **mask)
        ours = sets[0]
        bm = create_block_mask(mod, None, None, s, s, device="cuda")

        def flex_fns(o):
            qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (o.q, o.k, o.v))

            def ff():
                return flex(o.q, o.k, o.v, block_mask=bm, enable_gqa=True)

            def ffb():
                out = flex(qg, kg, vg, block_mask=bm, enable_gqa=True)
                out.backward(o.do)
                qg.grad = kg.grad = vg.grad = None

            return ff, ffb

        fns = [flex_fns(o) for o in sets]
        t_of, t_ofb = bench([o.fwd for o in sets]), bench([o.fwd_bwd for o in sets])
        t_ff, t_ffb = bench([f for f, _ in fns]), bench([fb for _, fb in fns])
        ours.fwd()
        err = rel_err(ours.o, fns[0][0]())
        lines.append(f"| {name} | {t_of:.3f} | {t_ff:.3f} | {t_ff / t_of:.2f} | {t_ofb:.3f} | {t_ffb:.3f} | "
                     f"{t_ffb / t_ofb:.2f} | {err:.1e} |")
        print(lines[-1], flush=True)


def tiny_llama(fl, lines):
    """tiny_llama's attention (configs/tiny_llama.yaml: b8, 8 query heads over 2 KV heads, s1024, d64,
    causal) in each precision: ours (GQA read in place) against PyTorch's SDPA backends on K and V
    repeated to 8 heads beforehand (outside the timed region), as the PyTorch mirror's step runs it."""
    lines.append("\n## tiny_llama attention: b8 hq8 hk2 s1024 d64 causal, ms (GPU time: bench()'s queued calls behind a "
                 "spin kernel); bwd = f+b − fwd; ratio = PyTorch / ours (>1: ours faster)\n")
    lines.append("| dtype | PyTorch backend | ours fwd | torch fwd | ours bwd | torch bwd | ratio fwd | ratio bwd | rel err O |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    b, hq, hk, s, d = 8, 8, 2, 1024, 64
    for dt in (torch.bfloat16, torch.float32):
        sets = input_sets(fl, b, hq, hk, s, d, dt, causal=True)
        ours = sets[0]
        t_of, t_ofb = bench([o.fwd for o in sets]), bench([o.fwd_bwd for o in sets])
        repeated = [[t.repeat_interleave(hq // hk, dim=1) for t in (o.k, o.v)] for o in sets]
        backends = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)) if dt == torch.bfloat16 \
            else (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH))
        ours.fwd()
        for name, be in backends:
            fns = [torch_fns(o.q, kr, vr, o.do, True, be) for o, (kr, vr) in zip(sets, repeated)]
            try:
                t_tf, t_tfb = bench([f for f, _ in fns]), bench([fb for _, fb in fns])
            except RuntimeError as e:  # a backend may refuse a shape or dtype
                print(f"{name} failed: {e}", file=sys.stderr)
                continue
            err = rel_err(ours.o, fns[0][0]())
            lines.append(f"| {str(dt).split('.')[-1]} | {name} | {t_of:.4f} | {t_tf:.4f} | {t_ofb - t_of:.4f} | "
                         f"{t_tfb - t_tf:.4f} | {t_tf / t_of:.2f} | {(t_tfb - t_tf) / (t_ofb - t_of):.2f} | {err:.1e} |")
            print(lines[-1], flush=True)
        del sets, repeated, ours


def fp32_seed(fl, lines):
    lines.append("\n## fp32 B=1 H=8 D=64, not causal, µs of GPU time (bench()), the default kernels (on the H100: the forward on the FP64 "
                 "tensor cores from 24 blocks, the backward on FFMA); ratio = SDPA default / ours (>1: ours faster)\n")
    lines.append("| S | ours fwd | SDPA default fwd | speedup | ours f+b | SDPA default f+b | speedup f+b | "
                 "ours f+b deterministic | speedup det. | max abs err O | max abs err dQ |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    # The other ways to run fp32, on the same inputs against the same SDPA times: the exact FFMA
    # kernels throughout (fp64Mma = kOff), TF32 (FlashAttentionConfig::tf32) and the FP64 tensor
    # cores for forward and backward (fp64Mma = kOn). The launcher reads the switches at every call.
    variants = (("ffma", "PA_FLASH_FP64MMA", "0", "the FFMA kernels throughout (fp64Mma = kOff)"),
                ("tf32", "PA_FLASH_TF32", "1", "the TF32 opt-in (tf32 = true)"),
                ("fp64mma", "PA_FLASH_FP64MMA", "1", "the FP64 tensor cores, forward and backward (fp64Mma = kOn)"))
    optin_lines = {name: [] for name, *_ in variants}
    for s in (128, 512, 1024, 4096):
        sets = input_sets(fl, 1, 8, 8, s, 64, torch.float32)
        ours = sets[0]
        q, k, v = ours.q, ours.k, ours.v
        fns = [sdpa_default_fns(o) for o in sets]
        t_of, t_ofb = bench([o.fwd for o in sets]), bench([o.fwd_bwd for o in sets])
        t_tf, t_tfb = bench([f for f, _ in fns]), bench([fb for _, fb in fns])
        # The deterministic backward (no atomics: above 512 keys dQ gets its own kernel).
        # Built under the switch: the backward's workspace depends on it.
        os.environ["PA_FLASH_DETERMINISTIC"] = "1"
        t_ofb_det = bench([o.fwd_bwd for o in input_sets(fl, 1, 8, 8, s, 64, torch.float32)])
        del os.environ["PA_FLASH_DETERMINISTIC"]
        ours.fwd_bwd()
        qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        ref = torch.softmax((qd @ kd.transpose(-1, -2)) / 8.0, -1) @ vd
        ref.backward(ours.do.double())
        err = (ours.o.double() - ref.detach()).abs().max().item()
        err_dq = (ours.dq.double() - qd.grad).abs().max().item()
        lines.append(f"| {s} | {t_of * 1e3:.1f} | {t_tf * 1e3:.1f} | {t_tf / t_of:.2f} | {t_ofb * 1e3:.1f} | "
                     f"{t_tfb * 1e3:.1f} | {t_tfb / t_ofb:.2f} | {t_ofb_det * 1e3:.1f} | {t_tfb / t_ofb_det:.2f} | "
                     f"{err:.1e} | {err_dq:.1e} |")
        print(lines[-1], flush=True)
        for name, switch, value, _ in variants:
            os.environ[switch] = value
            x_sets = input_sets(fl, 1, 8, 8, s, 64, torch.float32)
            t_xf, t_xfb = bench([o.fwd for o in x_sets]), bench([o.fwd_bwd for o in x_sets])
            del x_sets
            ours_x = Ours(fl, q, k, v)
            ours_x.do.copy_(ours.do)
            ours_x.fwd_bwd()
            del os.environ[switch]
            rel_o = rel_err(ours_x.o, ref.detach())
            rel_dq = rel_err(ours_x.dq, qd.grad)
            optin_lines[name].append(
                f"| {s} | {t_xf * 1e3:.1f} | {t_tf * 1e3:.1f} | {t_tf / t_xf:.2f} | {t_xfb * 1e3:.1f} | "
                f"{t_tfb * 1e3:.1f} | {t_tfb / t_xfb:.2f} | {(ours_x.o.double() - ref.detach()).abs().max().item():.1e} | "
                f"{(ours_x.dq.double() - qd.grad).abs().max().item():.1e} | {rel_o:.1e} | {rel_dq:.1e} |")
            print(name, optin_lines[name][-1], flush=True)
    for name, _, _, what in variants:
        lines.append(f"\n## fp32 inputs on {what}, same shapes and SDPA times, µs; ratio = SDPA default / ours\n")
        lines.append(f"| S | ours {name} fwd | SDPA default fwd | speedup | ours {name} f+b | SDPA default f+b | "
                     "speedup f+b | max abs err O | max abs err dQ | rel err O | rel err dQ |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        lines.extend(optin_lines[name])


def fp32_backward_variant(fl, sets, causal, switches, ref):
    """Sets the PA_FLASH_* `switches` (name: value, "" for the rule), rebuilds the backward's
    arguments (its workspace depends on them), times forward and forward + backward, and checks
    dQ, dK, dV against float64 SDPA (`ref`, computed on the first call). Returns (forward ms,
    forward + backward ms, relative error, ref)."""
    for n, val in switches.items():
        os.environ[n] = val
    for o in sets:
        o.ws = fl.workspace(o.q, o.k, causal=causal)
        o.ba = fl.backward_args(o.q, o.k, o.v, o.o, o.do, o.dq, o.dk, o.dv, o.lse, o.ws, causal=causal)
    t_f, t_fb = bench([o.fwd for o in sets]), bench([o.fwd_bwd for o in sets])
    o0 = sets[0]
    o0.fwd_bwd()
    torch.cuda.synchronize()
    got = torch.cat([o0.dq.flatten(), o0.dk.flatten(), o0.dv.flatten()])
    if ref is None:
        qg, kg, vg = (t.detach().double().requires_grad_(True) for t in (o0.q, o0.k, o0.v))
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        out.backward(o0.do.double())
        ref = torch.cat([qg.grad.flatten(), kg.grad.flatten(), vg.grad.flatten()])
    return t_f, t_fb, rel_err(got, ref), ref


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "build", "bench", "libpa_flash_bench.so"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="anchors,gqa,fp32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dims", default="64,128", help="--only tune, bwdtune: head dims")
    ap.add_argument("--seqs", default="4096", help="--only tune: sequence lengths (batch 16384 / S)")
    ap.add_argument("--anchor-seqs", default=None, help="--only anchors: these sequence lengths only, at --dims")
    ap.add_argument("--headdims", default="16,32,96", help="--only headdims: head dims")
    a = ap.parse_args()
    a.dims, a.seqs = [int(x) for x in a.dims.split(",")], [int(x) for x in a.seqs.split(",")]
    a.headdims = [int(x) for x in a.headdims.split(",")]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    fl = Flash(a.lib)
    lines = [f"# flash attention vs PyTorch {torch.__version__} on {torch.cuda.get_device_name()}"]
    if "probe128" in a.only:  # the fp32 seeds' S = 128 forward + backward, one call, for ncu
        q, k, v = qkv(1, 8, 8, 128, 64, torch.float32)
        Ours(fl, q, k, v).fwd_bwd()
        torch.cuda.synchronize()
        return
    if "gqaprobe" in a.only:  # one forward + backward of the GQA window + sinks row, for ncu
        q, k, v = qkv(4, 16, 4, 4096, 128, torch.bfloat16)
        Ours(fl, q, k, v, causal=True, window=(1023, -1), sinks=4).fwd_bwd()
        torch.cuda.synchronize()
        return
    if "probe" in a.only:  # one call of each kernel, for ncu
        for dt in (torch.bfloat16, torch.float32):
            q, k, v = (torch.randn(4, 16, 4096, 128 if dt == torch.bfloat16 else 64, device="cuda", dtype=dt)
                       for _ in range(3))
            Ours(fl, q, k, v).fwd_bwd()
        torch.cuda.synchronize()
        return
    if "tf32tune" in a.only:  # fp32 inputs on TF32 tensor cores: forward and f+b, for the tile knobs
        os.environ["PA_FLASH_TF32"] = "1"
        for d in (64, 128):
            for causal in (False, True):
                b, h, s = 4, 2048 // d, 4096
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float32) for _ in range(3))
                ours = Ours(fl, q, k, v, causal=causal)
                tf, tfb = bench(ours.fwd), bench(ours.fwd_bwd)
                fl_f = 4 * b * h * s * s * d / (2 if causal else 1)
                knobs = " ".join(f"{n}={os.environ[n]}" for n in ("PA_FLASH_FWD_TILE", "PA_FLASH_FWD_MT", "PA_FLASH_DQ_MT",
                                                                  "PA_FLASH_DQ_TILE", "PA_FLASH_ATOMIC_DQ") if n in os.environ)
                print(f"tf32tune d={d} causal={causal} {knobs}: fwd {tf:.3f} ms {fl_f / tf / 1e9:.0f} TFLOP/s, "
                      f"f+b {tfb:.3f} ms {3.5 * fl_f / tfb / 1e9:.0f} TFLOP/s", flush=True)
        del os.environ["PA_FLASH_TF32"]
        return
    if "fp64tune" in a.only:  # fp32 seeds' S = 4096 on the FP64 tensor cores, for its knobs (PA_FLASH_F64_FWD_WARPS, ...)
        q, k, v = (torch.randn(1, 8, 4096, 64, device="cuda", dtype=torch.float32) for _ in range(3))
        ours = Ours(fl, q, k, v)
        os.environ["PA_FLASH_FP64MMA"] = "0"
        t_ff, t_ffb = bench(ours.fwd), bench(ours.fwd_bwd)  # the exact FFMA kernels, same inputs
        os.environ["PA_FLASH_FP64MMA"] = "1"
        ours_x = Ours(fl, q, k, v)
        ours_x.do.copy_(ours.do)
        t_xf, t_xfb = bench(ours_x.fwd), bench(ours_x.fwd_bwd)
        del os.environ["PA_FLASH_FP64MMA"]
        knobs = " ".join(f"{n}={os.environ[n]}" for n in ("PA_FLASH_F64_FWD_WARPS", "PA_FLASH_FWD_TILE",
                                                          "PA_FLASH_DETERMINISTIC") if n in os.environ)
        print(f"fp64tune S=4096 {knobs}: fwd {t_xf * 1e3:.1f} us (FFMA {t_ff * 1e3:.1f}), "
              f"f+b {t_xfb * 1e3:.1f} us (FFMA {t_ffb * 1e3:.1f})", flush=True)
        return
    if "fp64sweep" in a.only:  # fp32 forward, FFMA against the FP64 tensor cores, for kAuto's grid rule
        for d in (32, 64):
            for b, h in ((1, 8), (2, 8), (4, 16)):
                for s in (64, 128, 192, 256, 320, 384, 512, 768):
                    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float32) for _ in range(3))
                    t = {}
                    for mode in ("0", "1"):
                        os.environ["PA_FLASH_FP64MMA"] = mode
                        t[mode] = bench(Ours(fl, q, k, v).fwd)
                    del os.environ["PA_FLASH_FP64MMA"]
                    print(f"fp64sweep d={d} b={b} h={h} s={s} blocks64={b * h * ((s + 63) // 64)}: "
                          f"ffma {t['0'] * 1e3:.1f} us, dmma {t['1'] * 1e3:.1f} us, ffma/dmma {t['0'] / t['1']:.2f}",
                          flush=True)
        return
    if "bwdtune" in a.only:  # backward only (fwd+bwd minus fwd), b·s = 16384, h·d = 2048; PA_FLASH_ATOMIC_DQ / _BWD_PERSISTENT=0/1
        for d, s, causal in itertools.product(a.dims, (1024, 4096), (False, True)):
            b, h = 16384 // s, 2048 // d
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ours = Ours(fl, q, k, v, causal=causal)
            ms = bench(ours.fwd_bwd) - bench(ours.fwd)
            fl_b = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            print(f"bwdtune d={d} s={s} causal={causal} atomic_dq={os.environ.get('PA_FLASH_ATOMIC_DQ', '0')} "
                  f"dq_mt={os.environ.get('PA_FLASH_DQ_MT', '-')} dq_tile={os.environ.get('PA_FLASH_DQ_TILE', '-')} "
                  f"tma={os.environ.get('PA_FLASH_TMA', '-')} st={os.environ.get('PA_FLASH_BWD_STAGES', '-')} "
                  f"ps={os.environ.get('PA_FLASH_BWD_PERSISTENT', '-')}: "
                  f"{ms:.3f} ms, {fl_b / ms / 1e9:.0f} TFLOP/s", flush=True)
        return
    if "f32split" in a.only:  # fp32 FFMA dK/dV: rows per thread x blocks per key block (PA_FLASH_F32_BWD_R / _SPLIT), vs SDPA default
        shapes = tuple((1, 8, s, 64, False) for s in (512, 768, 1024, 1536, 2048, 4096)) + (
            (1, 8, 1024, 64, True), (1, 8, 1024, 32, False), (1, 8, 1024, 128, False), (1, 4, 1024, 64, False),
            (2, 8, 1024, 64, False), (1, 8, 512, 64, True), (1, 8, 512, 128, False), (1, 8, 2048, 128, False))
        variants = (("", ""), ("2", "1"), ("4", "1"), ("4", "2"), ("4", "4"), ("2", "2"))
        if "f32splitcausal" in a.only:  # the causal rows, for the rule's tie-break (R 4 in 1, 2, 4 parts)
            shapes = tuple((b, h, s, 64, True) for (b, h, s) in ((1, 8, 768), (1, 8, 1024), (1, 8, 1536), (1, 8, 2048),
                                                                 (1, 8, 4096), (2, 8, 1024), (1, 4, 1024)))
            variants = (("", ""), ("4", "1"), ("4", "2"), ("4", "4"))
        for b, h, s, d, causal in shapes:
            sets = input_sets(fl, b, h, h, s, d, torch.float32, causal=causal)
            fl_f = 4 * b * h * s * s * d / (2 if causal else 1)
            fns = [torch_fns(o.q, o.k, o.v, o.do, causal, SDPBackend.EFFICIENT_ATTENTION) for o in sets]  # fp32's default
            t_tf, t_tfb = bench([f for f, _ in fns]), bench([fb for _, fb in fns])
            print(f"f32split b={b} h={h} s={s} d={d} causal={causal} SDPA efficient: fwd {t_tf * 1e3:.1f} us, f+b {t_tfb * 1e3:.1f} us",
                  flush=True)
            ref = None
            for rows, split in variants:
                t_f, t_fb, err, ref = fp32_backward_variant(
                    fl, sets, causal, {"PA_FLASH_F32_BWD_R": rows, "PA_FLASH_F32_BWD_SPLIT": split}, ref)
                print(f"f32split b={b} h={h} s={s} d={d} causal={causal} rows={rows or 'rule'} split={split or 'rule'}: "
                      f"fwd {t_f * 1e3:.1f} us, f+b {t_fb * 1e3:.1f} us, bwd {(t_fb - t_f) * 1e3:.1f} us "
                      f"({2.5 * fl_f / (t_fb - t_f) / 1e9:.1f} TFLOP/s), SDPA f+b / ours {t_tfb / t_fb:.2f}, "
                      f"rel err grads {err:.1e}", flush=True)
            for n in ("PA_FLASH_F32_BWD_R", "PA_FLASH_F32_BWD_SPLIT"):
                del os.environ[n]
            del sets, fns
        return
    if "f32bwd" in a.only:  # fp32 backward engines (FFMA / FP64 tensor cores) and dQ schemes at attn_block-like shapes
        grid = "f32bwdgrid" in a.only  # many shapes, the two engines only (for kAuto's backward rule)
        shapes = ((32, 4, 256, 64, True), (32, 4, 128, 64, True), (32, 4, 512, 64, True),
                  (8, 4, 1024, 64, True), (32, 4, 256, 64, False))
        if grid:
            shapes = tuple((b, h, s, d, c) for (b, h) in ((1, 8), (4, 8), (16, 8), (32, 4)) for s in (128, 256, 512, 1024)
                           for d in (32, 64) for c in (True,) if b * h * s <= 32 * 4 * 1024)
        variants = ((("0", "0", ""), ("1", "0", "")) if grid else
                    (("", "0", ""), ("0", "0", ""), ("0", "1", ""), ("0", "0", "1"), ("0", "0", "2"), ("0", "0", "4"),
                     ("1", "0", ""), ("1", "1", "")))
        for b, h, s, d, causal in shapes:
            sets = input_sets(fl, b, h, h, s, d, torch.float32, causal=causal)
            fl_f = 4 * b * h * s * s * d / (2 if causal else 1)
            ref = None
            for f64, atomic, rows in variants:
                t_f, t_fb, err, ref = fp32_backward_variant(
                    fl, sets, causal, {"PA_FLASH_FP64MMA": f64, "PA_FLASH_ATOMIC_DQ": atomic, "PA_FLASH_F32_BWD_R": rows}, ref)
                print(f"f32bwd b={b} h={h} s={s} d={d} causal={causal} fp64mma={f64 or 'auto'} atomic_dq={atomic} "
                      f"bwd_rows={rows or '-'}: fwd {t_f * 1e3:.1f} us, f+b {t_fb * 1e3:.1f} us, bwd {(t_fb - t_f) * 1e3:.1f} us "
                      f"({2.5 * fl_f / (t_fb - t_f) / 1e9:.1f} TFLOP/s), rel err grads {err:.1e}", flush=True)
            for n in ("PA_FLASH_FP64MMA", "PA_FLASH_ATOMIC_DQ", "PA_FLASH_F32_BWD_R"):
                del os.environ[n]
            if grid:
                del sets
                continue
            for name, be in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                fns = [torch_fns(o.q, o.k, o.v, o.do, causal, be) for o in sets]
                try:
                    t_f, t_fb = bench([f for f, _ in fns]), bench([fb for _, fb in fns])
                    print(f"f32bwd b={b} h={h} s={s} d={d} causal={causal} torch {name}: fwd {t_f * 1e3:.1f} us, "
                          f"f+b {t_fb * 1e3:.1f} us, bwd {(t_fb - t_f) * 1e3:.1f} us", flush=True)
                except RuntimeError as e:
                    print(f"f32bwd torch {name} failed: {e}", flush=True)
            del sets
        return
    if "gqatune" in a.only:  # ours alone on the GQA rows and the tiny models' attention; PA_FLASH_SPLIT_KV / _BWD_PERSISTENT=0/1
        sink = {"tiny_gpt_win128": True}
        for name, (b, hq, hk, s, d, mask) in {
                "gqa_causal": (4, 16, 4, 4096, 128, dict(causal=True)),
                "gqa_swa1024": (4, 16, 4, 4096, 128, dict(causal=True, window=(1023, -1))),
                "gqa_swa1024_sink4": (4, 16, 4, 4096, 128, dict(causal=True, window=(1023, -1), sinks=4)),
                "tiny_causal": (8, 8, 2, 1024, 64, dict(causal=True)),
                "tiny_gpt_win128": (8, 8, 2, 1024, 64, dict(causal=True, window=(128, -1))),
                "tiny_win128_sink4": (8, 8, 2, 1024, 64, dict(causal=True, window=(128, -1), sinks=4)),
                "b16_s1024_d128_causal": (16, 16, 4, 1024, 128, dict(causal=True)),
                "b2_hq32_s2048_d128": (2, 32, 8, 2048, 128, dict()),
                "b4_s4096_d64_causal": (4, 32, 8, 4096, 64, dict(causal=True)),
                "b1_s16384_swa1024_sink4": (1, 16, 4, 16384, 128, dict(causal=True, window=(1023, -1), sinks=4)),
                "mqa_b1_s4096_d128": (1, 8, 1, 4096, 128, dict(causal=True))}.items():
            if a.quick and not name.startswith("gqa_"):  # --quick: the three GQA rows only
                continue
            sets = input_sets(fl, b, hq, hk, s, d, torch.bfloat16, **mask)
            if sink.get(name):  # learnable sink logits, as tiny_gpt's layers have
                for o in sets:
                    o.sink = torch.randn(hq, device="cuda", dtype=torch.float32)
                    o.dsink = torch.empty_like(o.sink)
                    o.fa = fl.forward_args(o.q, o.k, o.v, o.o, o.lse, sink_logits=o.sink, **mask)
                    o.ba = fl.backward_args(o.q, o.k, o.v, o.o, o.do, o.dq, o.dk, o.dv, o.lse, o.ws,
                                            sink_logits=o.sink, dsink=o.dsink, **mask)
            t_f, t_fb = bench([o.fwd for o in sets]), bench([o.fwd_bwd for o in sets])
            print(f"gqatune {name} split_kv={os.environ.get('PA_FLASH_SPLIT_KV', '-')} "
                  f"ps={os.environ.get('PA_FLASH_BWD_PERSISTENT', '-')} fwd_tile={os.environ.get('PA_FLASH_FWD_TILE', '-')} "
                  f"fwd_wg={os.environ.get('PA_FLASH_FWD_WG', '-')}: "
                  f"fwd {t_f:.4f} ms, f+b {t_fb:.4f} ms, "
                  f"bwd {t_fb - t_f:.4f} ms", flush=True)
            del sets
        return
    if "tune" in a.only:  # forward only, for comparing tile knobs (PA_FLASH_FWD_TILE / _MT / _WG, PA_FLASH_WGMMA)
        for d, s in itertools.product(a.dims, a.seqs):
            for causal in (False, True):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                ours = Ours(fl, q, k, v, causal=causal)
                ms = bench(ours.fwd)
                fl_f = 4 * b * h * s * s * d / (2 if causal else 1)
                print(f"tune d={d} s={s} causal={causal} wgmma={os.environ.get('PA_FLASH_WGMMA', '-')} "
                      f"tile={os.environ.get('PA_FLASH_FWD_TILE', '-')} mt={os.environ.get('PA_FLASH_FWD_MT', '-')} "
                      f"wg={os.environ.get('PA_FLASH_FWD_WG', '-')} st={os.environ.get('PA_FLASH_FWD_STAGES', '-')}: {fl_f / ms / 1e9:.0f} TFLOP/s", flush=True)
        return
    if "headdims" in a.only:
        head_dims(fl, lines, a.headdims)
    if "tinyllama" in a.only:
        tiny_llama(fl, lines)
    if "fp32" in a.only:
        fp32_seed(fl, lines)
    if "gqa" in a.only:
        gqa_masks(fl, lines)
    if "anchors" in a.only:
        if a.anchor_seqs:
            anchors(fl, a.quick, lines, a.dims, [int(x) for x in a.anchor_seqs.split(",")])
        else:
            anchors(fl, a.quick, lines)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
