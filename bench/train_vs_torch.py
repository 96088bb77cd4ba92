#!/usr/bin/env python3
"""Training step time: PureAttention against PyTorch on the same model, in one run.

    train_vs_torch.py [--models tiny_gpt,tiny_llama] [--precisions fp32,bf16]
                      [--variants eager,compile,graph,max-autotune] [--set k=v ...]
                      [--bench build/bench/gpu_train_bench] [--budget-s 230] [--reps 5]
                      [--target-ms 200] [--sdpa best|default|cudnn|flash|efficient|math]
                      [--compile-scope block|model] [--ours-extra generated,no-graph]
                      [--out rows.jsonl] [--md table.md] [--dry-run]

Models are configs/<name>.yaml (any config of the layer sugar: linear, attention, mlp, norm,
position, repeat; the old anchors mlp_tiny, mlp_wide, attn_block too), with --set applied to both
sides. The PyTorch model is bench/pa_torch_blocks.py's, built from the same config through
tests/interop/pa_numpy.py (so it is the model torch_mirror.py checks against `train`), with
attention "auto": F.scaled_dot_product_attention where PyTorch supports the mask (is_causal for
tiny_llama's causal attention; a boolean attn_mask for windows and StreamingLLM sinks), the
explicit q k^T / mask / softmax / p v where it does not (learnable sink logits: tiny_gpt, whose
windowed layers are explicit too); the output names the formulation of every layer.

Precisions: fp32 (TF32 off on both sides; our `precision: fp32`), tf32, bf16 (torch.autocast
bfloat16 with fp32 parameters and fused Adam's fp32 state, as our `precision: bf16`).

Variants, each one JSON row:
 - ours: build/bench/gpu_train_bench on the config (--set precision=P plus yours): N queued
   steps replayed as a CUDA graph, one wait, median of R (its own timing; see its header);
   --ours-extra adds `ours generated` (compiler.gemm=generated) and `ours no-graph`;
 - eager: the module as is, torch.optim.Adam(fused=True);
 - compile: torch.compile default mode (Inductor, no CUDA graphs), fused Adam outside;
 - max-autotune: torch.compile(mode="max-autotune-no-cudagraphs"); run last, in its own
   process, only as far as the time budget allows (Inductor's GEMM autotuning takes minutes);
 - graph: the compiled model (default mode) with the whole step (forward, backward,
   Adam(fused=True, capturable=True), and the next batch's selection) captured in one
   torch.cuda.graph and replayed: PyTorch's fastest way to run a fixed-shape step.
--compile-scope block (default) compiles each top-level layer module separately (PyTorch's
"regional compilation": the repeated blocks share one compiled graph, which keeps compile times
within the budget); `model` compiles the whole model as one graph (cross-block fusion, longer
compiles).

SDPA backend (models with an SDPA layer): the worker first times forward + backward of one such
layer's attention alone on each backend (cuDNN, flash, memory-efficient, math; forced through
torch.nn.attention.sdpa_kernel, which also tells which are unavailable for the dtype/shape),
notes which one PyTorch's default picks (the profiler's kernel names), and with --sdpa best
(default) enables only the fastest for the whole run (torch.backends.cuda.enable_*_sdp, which
torch.compile honours as well); --sdpa default leaves PyTorch's choice.

Timing, the same for every PyTorch variant: warm-up steps first (compilation included; its time
is reported as compile_s), then per repetition one CUDA event pair around N queued steps (N
graph replays), one synchronize, ms = elapsed / N; the median of --reps repetitions. N is chosen
from a timed warm-up so that one repetition takes about --target-ms. No step reads anything back
to the host, so host overhead is hidden wherever the GPU is the slower side. Inputs are fresh
random batches rotating through a pool of more than 64 MiB (beyond the H100's 50 MB L2): step i
uses batch i mod n (the graph variant advances a device-side index inside the graph). Ours feeds
its own dataset's batches (N distinct rows of the config's data).

FLOPs (analytic, pa_numpy.step_flops): 6 * (weight-matrix parameters) * tokens for the
matrix products, plus per attention layer 3.5 * 4 * B * heads * head_dim * (visible query-key
pairs under its causal/window/sink mask: the backward's five products, the recomputed QK^T among
them, as FlashAttention's papers count; tables before 2026-11-26's third session used 3); norms,
activations, softmax and Adam are not counted; gpu_train_bench's model_gflop counts the same
(codegen/flops.h). "this / ours" is the variant's ms over ours (> 1: ours is
faster). TFLOP/s = FLOPs / step time, against the H100 SXM's dense
peak: bf16 989, tf32 494, fp32 67 (no tensor cores) TFLOP/s.

Time: --budget-s (default 230 s) bounds the whole run: ours and the eager/compile/graph worker of
each (model, precision) first, in that order, each worker with a fair share of the time left as
its timeout (what a fast one leaves over goes to the next); then max-autotune as far as the budget goes (a skipped or cut variant is a
row with an error saying so). Rows go to stdout as `{"row": ...}` JSON lines as they come, and
to --out (JSON Lines); the markdown table comes at the end (and to --md).

--dry-run (no GPU needed): resolves the configs, counts FLOPs, builds each PyTorch model and
runs one eager CPU step per variant that needs no GPU, to check everything up to the timing
(use --set to shrink: --set data.window=64 --set model.input=[64,8] --set train.batch_size=2).

On the H100, from the repository root after building (build/bench/gpu_train_bench):
    python3 bench/train_vs_torch.py --out bench/logs/train_vs_torch.jsonl --md bench/logs/train_vs_torch.md
    python3 bench/train_vs_torch.py --models mlp_tiny,mlp_wide,attn_block --precisions fp32,tf32,bf16
"""
import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
sys.path.insert(0, HERE)
import pa_numpy as pn  # noqa: E402

PEAK_TFLOPS = {"bf16": 989.0, "tf32": 494.0, "fp32": 67.0}  # H100 SXM, dense
POOL_BYTES = 64 << 20
TORCH_VARIANTS = ("eager", "compile", "graph", "max-autotune")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The config, as both sides see it.

def resolve(name, sets):
    """(config dict with --set applied, pa_numpy model, input shape, target shape, batch)."""
    path = os.path.join(ROOT, "configs", name + ".yaml")
    with open(path) as f:
        cfg = yaml.safe_load(f)
    for s in sets:
        pn.apply_set(cfg, s)
    shapes = pn.sample_shapes(cfg)
    if shapes is None:
        raise ValueError(f"{name}: data kind {cfg['data'].get('kind')} has no shapes without its file")
    xs, ys = shapes
    model = pn.Model.from_config(cfg, xs, ys)
    batch = int((cfg.get("train") or {}).get("batch_size", 64))
    return cfg, model, xs, ys, batch


# ---------------------------------------------------------------------------------------------
# The worker: one process per (model, precision, variant list), so that a crash, a hang in a
# compile or an out-of-memory costs one job, and a timeout can stop it.

def worker(spec):
    import torch
    import torch.nn.functional as F
    import pa_torch_blocks as tb

    dev = torch.device(spec["device"])
    cuda = dev.type == "cuda"
    prec = spec["precision"]
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.set_float32_matmul_precision("high" if prec == "tf32" else "highest")
    if spec["compile_scope"] == "block":
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    cfg, pnm, xs, ys, batch = spec["config"], None, spec["input"], spec["target"], spec["batch"]
    pnm = pn.Model.from_config(cfg, xs, ys)
    base = {"model": spec["model"], "precision": prec, "batch": batch, "flops": spec["flops"],
            "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}

    def emit(row):
        print("ROW " + json.dumps({**base, **row}), flush=True)

    def fresh_model():
        torch.manual_seed(0)
        return tb.build(pnm, "auto", torch.float32).to(dev)

    formulations = fresh_model().attention_formulations()
    base["attention"] = "; ".join(sorted({f.split(": ", 1)[1] for f in formulations})) or "none"

    # Rotating inputs: more than POOL_BYTES of distinct batches.
    per_batch = 4 * batch * (math.prod(xs) + math.prod(ys))
    n_pool = 2 if not cuda else max(2, min(4096, math.ceil(spec["pool_bytes"] / per_batch)))
    g = torch.Generator(device="cpu").manual_seed(1)
    xpool = torch.randn((n_pool, batch, *xs), generator=g).to(dev)
    ypool = torch.randn((n_pool, batch, *ys), generator=g).to(dev)
    base["pool_mib"] = round(n_pool * per_batch / 2 ** 20, 1)

    # SDPA backend: probe, then keep the fastest (or what was asked).
    base["sdpa"] = sdpa_setup(torch, spec, pnm, batch, dev) if cuda and any(
        f.split(": ", 1)[1].startswith("sdpa") for f in formulations) else None

    bf16 = prec == "bf16"

    def make_step(model, opt):
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                pred = model(x)
            loss = F.mse_loss(pred.float(), y.reshape(pred.shape))
            loss.backward()
            opt.step()
            return loss
        return step

    def compile_model(model, mode):
        kw = {} if mode == "default" else {"mode": mode}
        if spec["compile_scope"] == "model":
            return torch.compile(model, **kw)
        for i in range(len(model.layers)):
            model.layers[i] = torch.compile(model.layers[i], **kw)
        return model

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(run, warm):
        """run(i) queues step i. Warm-up (returns its seconds), then reps of N queued steps."""
        t0 = time.perf_counter()
        for i in range(warm):
            run(i)
        sync()
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(3):
            run(i)
        sync()
        est_ms = max((time.perf_counter() - t0) / 3 * 1e3, 1e-3)
        n = int(min(500, max(3, round(spec["target_ms"] / est_ms))))
        if not cuda:
            return est_ms, 3, compile_s, [est_ms]
        out = []
        for _ in range(spec["reps"]):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for i in range(n):
                run(i)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / n)
        return statistics.median(out), n, compile_s, out

    def report(variant, ms, n, compile_s, reps_ms, **extra):
        tflops = spec["flops"] / (ms * 1e-3) / 1e12
        emit({"variant": variant, "ms": ms, "steps_per_rep": n, "reps_ms": reps_ms,
              "compile_s": round(compile_s, 2), "tflops": tflops,
              "pct_peak": 100 * tflops / PEAK_TFLOPS[prec], **extra})

    lr = float(((cfg.get("train") or {}).get("optimizer") or {}).get("lr", 1e-3))
    for variant in spec["variants"]:
        try:
            if variant in ("eager", "compile", "max-autotune"):
                model = fresh_model()
                if variant != "eager":
                    model = compile_model(model, "default" if variant == "compile" else "max-autotune-no-cudagraphs")
                opt = torch.optim.Adam(model.parameters(), lr=lr, fused=cuda)
                step = make_step(model, opt)
                counter = iter(range(1 << 62))  # every queued step takes the next batch of the pool

                def run(_, step=step, counter=counter):
                    b = next(counter) % n_pool
                    step(xpool[b], ypool[b])

                ms, n, cs, reps = timed(run, 3 if variant == "eager" else 4)
                report(variant, ms, n, cs, reps)
            elif variant == "graph":
                if not cuda:
                    emit({"variant": variant, "error": "needs CUDA"})
                    continue
                ms, n, cs, reps, how = graph_variant(torch, F, fresh_model, compile_model, make_step, lr,
                                                     xpool, ypool, n_pool, bf16, timed)
                report(variant, ms, n, cs, reps, how=how)
            else:
                emit({"variant": variant, "error": "unknown variant"})
        except Exception as e:  # report and go on
            emit({"variant": variant, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]})
        if cuda:
            torch.cuda.empty_cache()


def graph_variant(torch, F, fresh_model, compile_model, make_step, lr, xpool, ypool, n_pool, bf16, timed):
    """The compiled model's whole step in one CUDA graph: the batch is chosen on the device
    (index_select with an index the graph advances), so a replay needs nothing from the host."""
    t0 = time.perf_counter()
    how = "torch.compile (default) model, whole step in one CUDA graph"
    try:
        model, opt, idx, body = _graph_step(torch, F, compile_model(fresh_model(), "default"), lr, xpool, ypool,
                                            n_pool, bf16)
    except Exception as e:  # the eager model in the graph then, and say so
        how = f"eager model in one CUDA graph (compiled: {type(e).__name__}: {str(e).splitlines()[0][:120]})"
        torch.cuda.synchronize()
        model, opt, idx, body = _graph_step(torch, F, fresh_model(), lr, xpool, ypool, n_pool, bf16)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        body()
    torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    ms, n, _, reps = timed(lambda i: graph.replay(), 3)
    return ms, n, setup_s, reps, how


def _graph_step(torch, F, model, lr, xpool, ypool, n_pool, bf16):
    """The step's body for capture (the batch picked on the device by an index the step
    advances), after warm-up runs off the capture stream, as the CUDA graph docs ask."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=True, capturable=True)
    idx = torch.zeros(1, dtype=torch.long, device=xpool.device)

    def body():
        x = xpool.index_select(0, idx).squeeze(0)
        y = ypool.index_select(0, idx).squeeze(0)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            pred = model(x)
        loss = F.mse_loss(pred.float(), y.reshape(pred.shape))
        loss.backward()
        opt.step()
        idx.add_(1)
        idx.remainder_(n_pool)
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles) off the capture stream
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return model, opt, idx, body


def sdpa_setup(torch, spec, pnm, batch, dev):
    """Times one SDPA layer's attention alone on each backend, notes PyTorch's default choice,
    and enables the chosen backend(s) for the rest of the process. Returns a dict for the rows."""
    import torch.nn.functional as F
    import pa_torch_blocks as tb
    from torch.nn.attention import SDPBackend, sdpa_kernel

    probe_model = tb.build(pnm, "auto", torch.float32).to(dev)
    body = next(m.body for m in probe_model.layers
                if isinstance(m, tb.Block) and isinstance(m.body, tb.AttentionBody)
                and m.body.formulation.startswith("sdpa"))
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
    seq = body.visible.shape[0]
    hk = body.hk if body.gqa_native else body.hq
    q = torch.randn(batch, body.hq, seq, body.hd, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, hk, seq, body.hd, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, hk, seq, body.hd, device=dev, dtype=dtype, requires_grad=True)
    kw = {"enable_gqa": True} if body.gqa_native else {}
    if body.formulation == "sdpa is_causal":
        kw["is_causal"] = True
    elif body.formulation != "sdpa":
        kw["attn_mask"] = body.visible
    do = torch.randn(batch, body.hq, seq, body.hd, device=dev, dtype=dtype)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        out.backward(do)

    def time_it():
        for _ in range(3):
            fwd_bwd()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(10):
            fwd_bwd()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 10

    backends = {"cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None), "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    probe = {}
    for name, be in backends.items():
        if be is None:
            probe[name] = "not in this torch"
            continue
        try:
            with sdpa_kernel([be]):
                probe[name] = round(time_it(), 4)
        except Exception as e:
            probe[name] = f"unavailable ({type(e).__name__})"
    default = "unknown"
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fwd_bwd()
            torch.cuda.synchronize()
        names = " ".join(e.key for e in prof.key_averages()).lower()
        default = ("cudnn" if "cudnn" in names else "flash" if "flash" in names
                   else "efficient" if ("fmha" in names or "efficient" in names or "mem_eff" in names) else "math")
    except Exception as e:
        default = f"unknown ({type(e).__name__})"
    timed_ok = {n: t for n, t in probe.items() if isinstance(t, float)}
    want = spec["sdpa"]
    if want == "best":
        chosen = min(timed_ok, key=timed_ok.get) if timed_ok else "default"
    else:
        chosen = want
    if chosen != "default":
        flags = {"cudnn": "enable_cudnn_sdp", "flash": "enable_flash_sdp", "efficient": "enable_mem_efficient_sdp",
                 "math": "enable_math_sdp"}
        for name, fn in flags.items():
            # math stays on as the fallback for a layer whose mask the chosen backend cannot take
            # (PyTorch tries math last); a layer that falls back shows as a slow step, not an error
            if hasattr(torch.backends.cuda, fn):
                getattr(torch.backends.cuda, fn)(name in (chosen, "math"))
    log(f"  SDPA probe ({spec['model']}, {spec['precision']}, one layer fwd+bwd ms): {probe}; "
        f"PyTorch's default picks {default}; using {chosen}")
    return {"probe_ms": probe, "default_pick": default, "used": chosen}


# ---------------------------------------------------------------------------------------------
# The driver.

def run_ours(bench, name, precision, sets, steps, reps, gemm=None, graph=True):
    cmd = [bench, os.path.join(ROOT, "configs", name + ".yaml"), "--set", "precision=" + precision]
    for s in sets:
        cmd += ["--set", s]
    if gemm:
        cmd += ["--set", "compiler.gemm=" + gemm]
    cmd += ["--steps", str(steps), "--reps", str(reps)]
    if not graph:
        cmd.append("--no-cuda-graph")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 120 s"}
    if r.returncode != 0:
        return {"error": " ".join((r.stderr or r.stdout).strip().splitlines()[-2:])[:400]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_worker(spec, timeout):
    """Runs one worker; returns its rows (those it printed before a timeout or crash too) and an
    error line for the variants it did not report."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    err = None
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, timeout))
        out, stderr = r.stdout, r.stderr
        if r.returncode != 0:
            err = f"worker exit {r.returncode}: " + " ".join(stderr.strip().splitlines()[-2:])[:300]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        err = f"stopped at the time budget ({timeout:.0f} s for this worker)"
    for line in stderr.splitlines():
        if "SDPA probe" in line:
            log(line)
    rows = [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
    done = {r["variant"] for r in rows}
    for v in spec["variants"]:
        if v not in done:
            rows.append({"model": spec["model"], "precision": spec["precision"], "variant": v, "flops": spec["flops"],
                         "error": err or "not reported"})
    return rows


def markdown(rows, device, budget_note):
    lines = [f"# Training step, PureAttention vs PyTorch; {device}; {time.strftime('%Y-%m-%d')}", "",
             "ms: median over repetitions of (CUDA-event time of N queued steps) / N; TFLOP/s from the analytic "
             "step FLOPs (pa_numpy.step_flops); % of the H100 SXM dense peak (bf16 989, tf32 494, "
             "fp32 67 TFLOP/s). " + budget_note, "",
             "| model | precision | variant | attention | ms/step | TFLOP/s | % peak | this / ours | compile s | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ours = {(r["model"], r["precision"]): r.get("ms") for r in rows if r["variant"] == "ours" and "ms" in r}
    for r in rows:
        o = ours.get((r["model"], r["precision"]))
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['variant']} | {r.get('attention', '')} | | | | | | "
                         f"{r['error']} |")
            continue
        speed = "" if r["variant"] == "ours" or not o else f"{r['ms'] / o:.2f}"
        notes = []
        if r.get("sdpa"):
            notes.append(f"SDPA {r['sdpa']['used']} (default picks {r['sdpa']['default_pick']})")
        if r.get("how") and r["variant"] == "graph" and not r["how"].startswith("torch.compile"):
            notes.append(r["how"])
        if r["variant"] == "ours":
            notes.append(f"gemm {r.get('gemm', '')}, {r.get('launches')} launches/step")
        lines.append(f"| {r['model']} | {r['precision']} | {r['variant']} | {r.get('attention', '')} | {r['ms']:.3f} | "
                     f"{r['tflops']:.1f} | {r['pct_peak']:.1f} | {speed} | {r.get('compile_s', '')} | "
                     f"{'; '.join(notes)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "gpu_train_bench"))
    ap.add_argument("--models", default="tiny_gpt,tiny_llama")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--variants", default="eager,compile,graph,max-autotune",
                    help="PyTorch variants (ours always runs): " + ",".join(TORCH_VARIANTS))
    ap.add_argument("--set", action="append", default=[], help="config override for both sides, repeatable")
    ap.add_argument("--budget-s", type=float, default=230.0, help="wall-clock bound of the whole run")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--target-ms", type=float, default=200.0, help="about this long per timed repetition")
    ap.add_argument("--sdpa", default="best", choices=["best", "default", "cudnn", "flash", "efficient", "math"])
    ap.add_argument("--compile-scope", default="block", choices=["block", "model"])
    ap.add_argument("--ours-extra", default="", help="also: generated (compiler.gemm=generated), no-graph")
    ap.add_argument("--out", help="the rows as JSON Lines")
    ap.add_argument("--md", help="the markdown table")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: resolve, count, build, one eager step")
    a = ap.parse_args(argv)
    if a.worker:
        worker(json.loads(a.worker))
        return 0

    started = time.time()
    precisions = [p for p in a.precisions.split(",") if p]
    for p in precisions:
        if p not in PEAK_TFLOPS:
            ap.error(f"--precisions: {p} (known: {', '.join(PEAK_TFLOPS)})")
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in TORCH_VARIANTS:
            ap.error(f"--variants: {v} (known: {', '.join(TORCH_VARIANTS)})")
    device = "cpu (dry run)"
    if not a.dry_run:
        import torch
        if not torch.cuda.is_available():
            print("torch sees no CUDA device (use --dry-run to check the scripts on a CPU)")
            return 2
        device = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
        if not os.path.exists(a.bench):
            print(f"no {a.bench}: build it first (cmake --build build --target gpu_train_bench)")
            return 2
        del torch  # the workers time in their own processes; this one's CUDA context stays idle
    out = open(a.out, "w") if a.out else None
    rows = []

    def add(new):
        for r in new:
            rows.append(r)
            line = json.dumps({"row": r})
            print(line, flush=True)
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()

    models = {}
    for name in [m for m in a.models.split(",") if m]:
        try:
            cfg, pnm, xs, ys, batch = resolve(name, a.set)
            flops = pn.step_flops(pnm, batch)
            models[name] = (cfg, pnm, xs, ys, batch, flops)
            log(f"{name}: {sum(math.prod(s) for s in pnm.param_shapes().values()):,} parameters, batch {batch}, "
                f"input {list(pnm.input_shape)}, {flops / 1e9:.2f} GFLOP per step (analytic)")
        except Exception as e:
            add([{"model": name, "precision": p, "variant": "all", "error": f"config: {type(e).__name__}: {e}"}
                 for p in precisions])

    jobs = [(m, p) for m in models for p in precisions]
    basic = [v for v in variants if v != "max-autotune"]
    for j, (name, prec) in enumerate(jobs):
        cfg, pnm, xs, ys, batch, flops = models[name]
        spec = {"model": name, "precision": prec, "config": cfg, "input": xs, "target": ys, "batch": batch,
                "flops": flops, "sdpa": a.sdpa, "compile_scope": a.compile_scope, "target_ms": a.target_ms,
                "reps": a.reps, "pool_bytes": POOL_BYTES, "device": "cpu" if a.dry_run else "cuda",
                "variants": [v for v in basic if v != "graph"] if a.dry_run else basic}
        if not a.dry_run:
            # ours: N from the analytic FLOPs at 30% of peak, so a repetition takes ~target_ms
            est_ms = flops / (0.3 * PEAK_TFLOPS[prec] * 1e12) * 1e3
            n = int(min(200, max(5, round(a.target_ms / est_ms))))
            extra = [("ours", {}), ] + [(f"ours {x}", {"gemm": "generated"} if x == "generated" else {"graph": False})
                                        for x in a.ours_extra.split(",") if x in ("generated", "no-graph")]
            for label, kw in extra:
                r = run_ours(a.bench, name, prec, a.set, n, a.reps, **kw)
                row = {"model": name, "precision": prec, "variant": label, "flops": flops, "attention": "ours"}
                if "error" in r:
                    row["error"] = r["error"]
                else:
                    ms = r["ms_per_step"]
                    tfl = flops / (ms * 1e-3) / 1e12
                    row.update({"ms": ms, "tflops": tfl, "pct_peak": 100 * tfl / PEAK_TFLOPS[prec],
                                "steps_per_rep": n, "gemm": r.get("gemm"), "launches": r.get("launches_per_step"),
                                "ours": r})
                add([row])
        if a.dry_run and importlib.util.find_spec("torch") is None:
            log(f"{name} {prec}: no torch here: configs parsed and counted, nothing run")
            continue
        # a fair share of what is left (time a fast job leaves over goes to the next ones; ~10 s
        # kept for each later job's own `ours` run)
        remaining = a.budget_s - (time.time() - started)
        left_after = len(jobs) - j - 1
        timeout = (remaining - 10.0 * left_after) / (left_after + 1)
        if timeout < 20:
            add([{"model": name, "precision": prec, "variant": v, "flops": flops,
                  "error": f"skipped: time budget ({a.budget_s:.0f} s) spent"} for v in spec["variants"]])
            continue
        if spec["variants"]:
            add(run_worker(spec, timeout))
    if "max-autotune" in variants and not a.dry_run:
        for j, (name, prec) in enumerate(jobs):
            cfg, pnm, xs, ys, batch, flops = models[name]
            remaining = a.budget_s - (time.time() - started)
            share = remaining / (len(jobs) - j)
            if share < 30:
                add([{"model": name, "precision": prec, "variant": "max-autotune", "flops": flops,
                      "error": f"skipped: time budget ({a.budget_s:.0f} s) spent; raise --budget-s"}])
                continue
            spec = {"model": name, "precision": prec, "config": cfg, "input": xs, "target": ys, "batch": batch,
                    "flops": flops, "sdpa": a.sdpa, "compile_scope": a.compile_scope, "target_ms": a.target_ms,
                    "reps": a.reps, "pool_bytes": POOL_BYTES, "device": "cuda", "variants": ["max-autotune"]}
            add(run_worker(spec, share))
    if out:
        out.close()
    note = (f"Whole run {time.time() - started:.0f} s (budget {a.budget_s:.0f} s); torch.compile scope: "
            f"{a.compile_scope}.")
    text = markdown(rows, device, note)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
