"""Pictures of runs and of fused-vs-unfused comparisons, with matplotlib (imported on first use).

Both functions return the matplotlib Figure; ``path`` writes it too (PNG or SVG by extension).
``python3 -m pureattention.plot`` draws the same figures from ``train --metrics`` files and from
``train --compare`` output (what ``train --plot`` runs).
"""
import numpy as np


def _pyplot():
    import matplotlib
    if matplotlib.get_backend().lower() not in ("agg", "svg", "pdf", "cairo") and not _has_display():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _has_display():
    import os
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _save(fig, path):
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")


def run(run, path=None, title=None):
    """Training and validation loss (log scale) and the learning rate over the steps of `run`
    (a `Run`, or any object with arrays ``step``, ``loss``, ``val_loss``, ``lr``)."""
    plt = _pyplot()
    step, loss = np.asarray(run.step), np.asarray(run.loss)
    val, lr = np.asarray(run.val_loss, dtype=float), np.asarray(run.lr)
    fig, (ax, axlr) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True, height_ratios=[3, 1])
    ax.plot(step, loss, label="train loss", linewidth=1.0)
    has_val = np.isfinite(val)
    if has_val.any():
        ax.plot(step[has_val], val[has_val], "o-", label="validation loss", markersize=3)
    ax.set_yscale("log")
    ax.set_ylabel("MSE")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title or getattr(run, "name", "") or "training run")
    axlr.plot(step, lr, color="tab:green", label="learning rate")
    axlr.set_ylabel("learning rate")
    axlr.set_xlabel("step")
    axlr.grid(True, alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return fig


def compare(result, path=None, title=None):
    """`result` (a `CompareResult`, or a dict of the same fields): the fused and unfused loss
    curves overlaid (log scale), their relative difference per step against the tolerance, and
    time per step and peak activation memory side by side."""
    plt = _pyplot()
    get = (lambda k: result[k]) if isinstance(result, dict) else (lambda k: getattr(result, k))
    fused, unfused = get("fused"), get("unfused")
    lf, lu = np.asarray(fused["loss"]), np.asarray(unfused["loss"])
    n = min(len(lf), len(lu))
    steps = np.arange(1, n + 1)
    fig = plt.figure(figsize=(10, 6))
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2])
    ax = fig.add_subplot(grid[0, :])
    ax.plot(steps, lf[:n], label="fused", linewidth=1.5)
    ax.plot(steps, lu[:n], "--", label="unfused", linewidth=1.0)
    ax.set_yscale("log")
    ax.set_ylabel("training loss")
    ax.set_xlabel("step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    name = result.get("name") if isinstance(result, dict) else getattr(result, "name", "")
    ax.set_title(title or (f"{name}: fused against unfused" if name else "fused against unfused"))
    axd = fig.add_subplot(grid[1, 0])
    rel = np.abs(lf[:n] - lu[:n]) / np.maximum(np.abs(lu[:n]), 1e-30)
    axd.semilogy(steps, np.maximum(rel, 1e-17), color="tab:red", label="|fused - unfused| / |unfused|")
    axd.axhline(get("tolerance"), color="gray", linestyle=":", label="tolerance")
    axd.set_xlabel("step")
    axd.set_ylabel("relative difference")
    axd.grid(True, which="both", alpha=0.3)
    axd.legend(fontsize=8)
    axb = fig.add_subplot(grid[1, 1])
    ms = [fused["seconds_per_step"] * 1e3, unfused["seconds_per_step"] * 1e3]
    mib = [fused["activation_bytes"] / 2**20, unfused["activation_bytes"] / 2**20]
    x = np.arange(2)
    axb.bar(x - 0.2, ms, 0.4, label="ms / step", color=["tab:blue", "tab:orange"])
    axb.set_xticks(x, ["fused", "unfused"])
    axb.set_ylabel("time per step (ms)")
    axm = axb.twinx()
    axm.bar(x + 0.2, mib, 0.4, label="peak activations (MiB)", color=["tab:blue", "tab:orange"], alpha=0.45,
            hatch="//")
    axm.set_ylabel("peak activation memory (MiB)")
    axb.set_title("time (solid) and memory (hatched)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    return fig


class _MetricsRun:
    """A `Run`-like view of a ``train --metrics`` file (.csv or .jsonl)."""

    def __init__(self, path):
        import csv
        import json
        rows = []
        with open(path) as f:
            if path.endswith(".csv"):
                rows = list(csv.DictReader(f))
            else:
                rows = [json.loads(line) for line in f if line.strip()]
        def col(k):
            return np.array([float(r[k]) if r[k] not in ("", None) else np.nan for r in rows])
        self.step, self.loss, self.val_loss = col("step"), col("loss"), col("val_loss")
        self.lr, self.step_ms = col("lr"), col("step_ms")
        self.name = path


def main(argv=None):
    """``python3 -m pureattention.plot --metrics FILE OUT`` draws a run from a ``--metrics``
    file; ``--compare FILE.json OUT`` a comparison from ``train --compare --plot``'s JSON."""
    import argparse
    import json
    import sys
    if (argv if argv is not None else sys.argv[1:]) == ["--check"]:  # train --plot asks before training
        _pyplot()
        return 0
    p = argparse.ArgumentParser(prog="python3 -m pureattention.plot",
                                description="Draw a training run or a fused-vs-unfused comparison")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--metrics", help="a train --metrics file (.csv, .jsonl)")
    g.add_argument("--compare", help="the JSON that train --compare --plot writes")
    p.add_argument("--title", default=None)
    p.add_argument("output", help="the picture to write (.png or .svg)")
    a = p.parse_args(argv)
    if not a.output.endswith((".png", ".svg")):
        p.error(f"{a.output}: expected a .png or .svg file name")
    if a.metrics:
        run(_MetricsRun(a.metrics), a.output, a.title)
    else:
        with open(a.compare) as f:
            compare(json.load(f), a.output, a.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
