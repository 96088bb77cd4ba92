"""Plots render: files exist, are valid PNG / SVG, and hold the expected curves."""
import subprocess

import numpy as np
import pytest

import pureattention as pa


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import SMALL
    p = tmp_path_factory.mktemp("plot") / "small.yaml"
    p.write_text(SMALL)
    m = pa.Model.from_yaml(p)
    return p, m, m.train(steps=20)


def test_run_plot(trained, tmp_path):
    _, _, run = trained
    fig = pa.plot.run(run, tmp_path / "run.png")
    loss_ax, lr_ax = fig.axes
    assert len(loss_ax.get_lines()) == 2 and loss_ax.get_yscale() == "log" and len(lr_ax.get_lines()) == 1
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pa.plot.run(run, tmp_path / "run.svg")
    assert b"<svg" in (tmp_path / "run.svg").read_bytes()[:400]


def test_compare_plot(trained, tmp_path):
    _, m, _ = trained
    r = m.compare(steps=5)
    fig = pa.plot.compare(r, tmp_path / "cmp.svg")
    assert len(fig.axes[0].get_lines()) == 2  # fused and unfused overlaid
    assert len(fig.axes[1].get_lines()) == 2  # their difference and the tolerance
    assert len(fig.axes[2].patches) == 2 and len(fig.axes[3].patches) == 2  # time and memory bars
    assert b"<svg" in (tmp_path / "cmp.svg").read_bytes()[:400]


def test_train_plot_flag(trained, train_bin, tmp_path):
    p, _, _ = trained
    subprocess.run([train_bin, "-c", str(p), "--steps", "10", "--plot", str(tmp_path / "t.png"), "--progress", "none"],
                   check=True, capture_output=True)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    subprocess.run([train_bin, "-c", str(p), "--steps", "4", "--compare", "--plot", str(tmp_path / "c.svg")],
                   check=True, capture_output=True)
    assert b"<svg" in (tmp_path / "c.svg").read_bytes()[:400]
    bad = subprocess.run([train_bin, "-c", str(p), "--plot", str(tmp_path / "t.gif")], capture_output=True, text=True)
    assert bad.returncode == 2 and ".png or .svg" in bad.stderr
