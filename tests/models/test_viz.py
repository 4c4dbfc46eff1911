"""minitx.viz: PNG output with matplotlib, text fallback without it."""
import os

import numpy as np
import pytest

from support import need

from minitx import viz


def test_text_heatmap_shades_and_labels():
    m = np.array([[0.0, 1.0], [0.5, 0.25]])
    text = viz.text_heatmap(m, ["a", "b"], ["x", "y"], title="t")
    lines = text.splitlines()
    assert lines[0] == "t"
    assert "█" in text and "scale" in text
    assert any(line.startswith("a ") for line in lines)


def test_fallback_writes_txt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINITX_NO_MATPLOTLIB", "1")
    assert not viz.have_matplotlib()
    path = viz.heatmap(np.eye(3), ["a", "b", "c"], ["a", "b", "c"], str(tmp_path / "h.png"))
    assert path.endswith("h.txt") and os.path.exists(path)
    assert "█" in capsys.readouterr().out
    lp = viz.line_plot({"loss": [3, 2, 1.5, 1.2]}, str(tmp_path / "c.png"), quiet=True)
    assert lp.endswith(".txt") and "*" in open(lp, encoding="utf-8").read()
    grid = viz.heatmap_grid([np.eye(2), np.ones((2, 2))], ["h0", "h1"], str(tmp_path / "g.png"),
                            quiet=True)
    assert grid.endswith(".txt")


def test_png_with_matplotlib(tmp_path, monkeypatch):
    need("matplotlib")
    monkeypatch.delenv("MINITX_NO_MATPLOTLIB", raising=False)
    p = viz.heatmap(np.random.default_rng(0).random((4, 5)), list("abcd"), list("vwxyz"),
                    str(tmp_path / "h.png"), "title")
    assert p.endswith(".png") and open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    p = viz.line_plot({"a": ([1, 2, 4], [1, 4, 16]), "b": [1, 2, 3]}, str(tmp_path / "l.png"),
                      logx=True, logy=True)
    assert open(p, "rb").read(4) == b"\x89PNG"
    p = viz.heatmap_grid([np.eye(3)] * 3, ["a", "b", "c"], str(tmp_path / "g.png"))
    assert open(p, "rb").read(4) == b"\x89PNG"


def test_render_mask():
    assert viz.render_mask(np.array([[True, False], [True, True]])) == "■ ·\n■ ■"


@pytest.mark.parametrize("size", [2, 6, 20])
def test_a_heatmap_title_fits_inside_its_figure(tmp_path, monkeypatch, size):
    """A small matrix with a long title (the sentiment example's short reviews): the title's
    box lies inside the saved figure instead of running past its left edge."""
    need("matplotlib")
    import matplotlib.pyplot as plt
    monkeypatch.delenv("MINITX_NO_MATPLOTLIB", raising=False)
    boxes = []
    savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        savefig(fig, *args, **kwargs)
        renderer = fig.canvas.get_renderer()
        boxes.append((fig.axes[0].title.get_window_extent(renderer), fig.bbox))
    monkeypatch.setattr(plt.Figure, "savefig", spy)
    title = "label pos, predicted pos — last layer, mean over heads"
    viz.heatmap(np.eye(size), path=str(tmp_path / "h.png"), title=title)
    (box, figure), = boxes
    assert figure.x0 <= box.x0 and box.x1 <= figure.x1
