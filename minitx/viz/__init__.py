"""Pictures for the examples: heatmaps and line plots, with matplotlib when it is installed.

    from minitx.viz import heatmap, line_plot
    written = heatmap(weights, row_labels=words, col_labels=words, path="out/attn.png")

With matplotlib (Agg backend, no display needed) a PNG is written. Without it, the same
call prints a shaded-character picture to the terminal and writes it to a ``.txt`` file
next to the requested path; the function returns the path actually written. Set
``MINITX_NO_MATPLOTLIB=1`` to force the text fallback.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..backend import to_host

__all__ = ["have_matplotlib", "notebook_pyplot", "script_note", "text_heatmap", "heatmap",
           "heatmap_grid", "line_plot", "text_line_plot", "render_mask", "SHADES",
           "layer_head_figure"]

SHADES = " ░▒▓█"


def have_matplotlib() -> bool:
    """True when matplotlib imports (and ``MINITX_NO_MATPLOTLIB`` is not set)."""
    if os.environ.get("MINITX_NO_MATPLOTLIB", "").strip() not in ("", "0"):
        return False
    try:
        import matplotlib  # noqa: F401, PLC0415
    except Exception:
        return False
    return True


def notebook_pyplot(notebook: str, required: bool = True):
    """``matplotlib.pyplot`` for a notebook (``plt = notebook_pyplot("01_….py")``, in Jupyter
    or run as a script). Without matplotlib the notebook stops before its first cell's work
    with one line naming the extra to install, and no traceback (``SystemExit``); with
    ``required=False`` it returns None instead (a notebook whose pictures are optional). Run as
    a script, it first says in one line where the notebook's text is (``script_note``)."""
    script_note(notebook)
    if not have_matplotlib():
        if not required:
            return None
        raise SystemExit(f"{notebook} draws its figures with matplotlib, which is not "
                         f"installed here: python -m pip install \".[viz]\" (or \".[docs]\")")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (the [viz] extra, only here)
    return plt


def script_note(notebook: str) -> None:
    """Run as a script (``python notebooks/01_….py``), a notebook prints its numbers but not
    its markdown cells, where the teaching is: say so, and where to read them. In a Jupyter
    kernel (IPython loaded) it prints nothing."""
    if "IPython" in sys.modules:
        return
    print(f"{notebook} run as a script prints its numbers only. The text that explains them is\n"
          f"in its markdown cells: the '# %% [markdown]' comments of notebooks/{notebook}, or\n"
          "the same in Jupyter or on the reading site (python -m minitx site).\n")


def _plt():
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    return plt


def _txt_path(path):
    root, _ = os.path.splitext(path)
    return root + ".txt"


def _ensure_dir(path):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)


def render_mask(mask, on: str = "■", off: str = "·") -> str:
    """An (n, m) bool mask as text: one line per query, ■ = may attend, · = masked."""
    m = to_host(mask).astype(bool)
    return "\n".join(" ".join(on if x else off for x in row) for row in m)


def text_heatmap(matrix, row_labels=None, col_labels=None, title=None,
                 shades: str = SHADES) -> str:
    """A 2-d array as shaded characters (darker = larger), scaled to the matrix's range.

    Each cell is two characters wide; column labels are written vertically above the grid.
    """
    m = to_host(matrix).astype(float)
    if m.ndim != 2:
        raise ValueError(f"text_heatmap: matrix must be 2-d, got shape {m.shape}")
    lo, hi = float(np.nanmin(m)) if m.size else 0.0, float(np.nanmax(m)) if m.size else 1.0
    span = hi - lo if hi > lo else 1.0
    levels = np.clip(((m - lo) / span * (len(shades) - 1)).round(), 0, len(shades) - 1)
    rl = [str(r) for r in row_labels] if row_labels is not None else [str(i) for i in
                                                                        range(m.shape[0])]
    width = max((len(r) for r in rl), default=0)
    lines = [title] if title else []
    if col_labels is not None:
        cl = [str(c)[:8] for c in col_labels]
        depth = max((len(c) for c in cl), default=0)
        for i in range(depth):
            lines.append(" " * (width + 1) + "".join(
                (c[i] if i < len(c) else " ") + " " for c in cl))
    for r, row in zip(rl, levels):
        lines.append(r.rjust(width) + " " + "".join(shades[int(v)] * 2 for v in row))
    lines.append(f"{' ' * width} scale: '{shades[0]}' = {lo:.3g} … '{shades[-1]}' = {hi:.3g}")
    return "\n".join(lines)


def _text_fallback(text: str, path, quiet: bool):
    """Without matplotlib (or without a path): print ``text`` and, given a path, write it
    next to where the picture would have gone, as ``.txt``; returns that path or None."""
    if not quiet:
        print(text)
    if path is None:
        return None
    out = _txt_path(path)
    _ensure_dir(out)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return out


def heatmap(matrix, row_labels=None, col_labels=None, path=None, title=None,
            cmap: str = "viridis", quiet: bool = False):
    """Draw ``matrix`` (rows × columns) with labels.

    matplotlib: writes a PNG to ``path`` and returns it. Otherwise prints a text heatmap
    (unless ``quiet``) and, when ``path`` is given, writes it to ``path`` with a ``.txt``
    suffix and returns that path. Returns None when nothing was written.
    """
    m = to_host(matrix).astype(float)
    if path is not None and have_matplotlib():
        plt = _plt()
        _ensure_dir(path)
        rows, cols = m.shape
        # wide enough for the title too (about 0.085 inch a character at font size 10)
        width = max(3.5, 0.32 * cols + 2, 0.085 * len(title or "") + 1.0)
        fig, ax = plt.subplots(figsize=(width, max(3.0, 0.3 * rows + 1.5)))
        im = ax.imshow(m, cmap=cmap, aspect="auto")
        if col_labels is not None:
            ax.set_xticks(range(cols))
            ax.set_xticklabels([str(c) for c in col_labels], rotation=90, fontsize=8)
        if row_labels is not None:
            ax.set_yticks(range(rows))
            ax.set_yticklabels([str(r) for r in row_labels], fontsize=8)
        if title:
            ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    text = text_heatmap(m, row_labels, col_labels, title)
    return _text_fallback(text, path, quiet)


def heatmap_grid(matrices, titles=None, path=None, suptitle=None, labels=None,
                 cmap: str = "viridis", quiet: bool = False):
    """Several heatmaps side by side (e.g. one per attention head); same fallback rules."""
    mats = [to_host(m).astype(float) for m in matrices]
    titles = titles or [str(i) for i in range(len(mats))]
    if path is not None and have_matplotlib():
        plt = _plt()
        _ensure_dir(path)
        cols = min(4, len(mats))
        rows = (len(mats) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows + 0.4),
                                 squeeze=False)
        for ax in axes.flat[len(mats):]:
            ax.axis("off")
        for ax, m, t in zip(axes.flat, mats, titles):
            ax.imshow(m, cmap=cmap, aspect="auto")
            ax.set_title(t, fontsize=9)
            if labels is not None and len(labels) <= 40:
                ax.set_xticks(range(len(labels)))
                ax.set_xticklabels(labels, fontsize=6)
                ax.set_yticks(range(len(labels)))
                ax.set_yticklabels(labels, fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
        if suptitle:
            fig.suptitle(suptitle, fontsize=11)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    text = "\n\n".join(text_heatmap(m, labels, labels, t) for m, t in zip(mats, titles))
    if suptitle:
        text = suptitle + "\n" + text
    return _text_fallback(text, path, quiet)


def layer_head_figure(maps, tokens, title: str):
    """Every layer × head attention map of one sentence in one matplotlib ``Figure``: maps
    (L, H, N, N), rows = layers, columns = heads, the N tokens on the outer axes.

    Built without pyplot (no backend is switched), so a notebook shows the returned figure
    inline and a script saves it (``fig.savefig(path)``). Needs matplotlib.
    """
    from matplotlib.figure import Figure  # noqa: PLC0415 (the [viz] extra, only here)
    maps = to_host(maps).astype(float)
    layers, heads = maps.shape[:2]
    fig = Figure(figsize=(1.45 * heads + 1.2, 1.45 * layers + 1.2))
    axes = fig.subplots(layers, heads, squeeze=False)
    ticks = range(len(tokens))
    for li in range(layers):
        for hi in range(heads):
            ax = axes[li, hi]
            ax.imshow(maps[li, hi], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(ticks if li == layers - 1 else [])
            ax.set_yticks(ticks if hi == 0 else [])
            if li == layers - 1:
                ax.set_xticklabels(tokens, rotation=90, fontsize=5)
            if hi == 0:
                ax.set_yticklabels(tokens, fontsize=5)
                ax.set_ylabel(f"layer {li}", fontsize=8)
            if li == 0:
                ax.set_title(f"head {hi}", fontsize=8)
    fig.suptitle(title, fontsize=11)
    # fixed margins: tight_layout over 72 panels takes seconds
    fig.subplots_adjust(left=0.06, right=0.995, bottom=0.09, top=0.92, wspace=0.08, hspace=0.12)
    return fig


def _series(series):
    """{name: ys} or {name: (xs, ys)} → {name: (xs, ys)} as float arrays."""
    out = {}
    for name, s in series.items():
        if isinstance(s, tuple) and len(s) == 2:
            xs, ys = s
        else:
            ys = s
            xs = np.arange(len(ys))
        out[name] = (np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))
    return out


def text_line_plot(series, width: int = 60, height: int = 12, title=None, logx=False,
                   logy=False) -> str:
    """Curves as characters on a grid (one marker letter per series), with a legend."""
    ser = _series(series)
    markers = "*o+x#@%&"
    pts = []
    for k, (name, (xs, ys)) in enumerate(ser.items()):
        ok = np.isfinite(xs) & np.isfinite(ys)
        if logx:
            ok &= xs > 0
        if logy:
            ok &= ys > 0
        xs, ys = xs[ok], ys[ok]
        pts.append((markers[k % len(markers)], name,
                    np.log10(xs) if logx else xs, np.log10(ys) if logy else ys))
    allx = np.concatenate([p[2] for p in pts]) if pts else np.zeros(0)
    ally = np.concatenate([p[3] for p in pts]) if pts else np.zeros(0)
    if allx.size == 0:
        return (title or "") + "\n(no finite points)"
    x0, x1, y0, y1 = allx.min(), allx.max(), ally.min(), ally.max()
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1
    grid = [[" "] * width for _ in range(height)]
    for mark, _, xs, ys in pts:
        for x, y in zip(xs, ys):
            c = int(round((x - x0) / (x1 - x0) * (width - 1)))
            r = height - 1 - int(round((y - y0) / (y1 - y0) * (height - 1)))
            grid[r][c] = mark
    fy = (lambda v: f"{10 ** v:.3g}") if logy else (lambda v: f"{v:.3g}")
    fx = (lambda v: f"{10 ** v:.3g}") if logx else (lambda v: f"{v:.3g}")
    lines = [title] if title else []
    for i, row in enumerate(grid):
        label = fy(y1) if i == 0 else fy(y0) if i == height - 1 else ""
        lines.append(f"{label:>9} |" + "".join(row))
    lines.append(" " * 10 + "+" + "-" * width)
    lines.append(" " * 11 + fx(x0) + " " * max(1, width - len(fx(x0)) - len(fx(x1))) + fx(x1))
    lines.append("  ".join(f"{m} = {n}" for m, n, _, _ in pts))
    return "\n".join(lines)


def line_plot(series, path=None, title=None, xlabel=None, ylabel=None, logx=False,
              logy=False, quiet: bool = False):
    """Plot curves: ``series`` is {name: ys} or {name: (xs, ys)}. Same fallback as heatmap."""
    ser = _series(series)
    if path is not None and have_matplotlib():
        plt = _plt()
        _ensure_dir(path)
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, (xs, ys) in ser.items():
            ax.plot(xs, ys, marker="o" if len(xs) <= 20 else None, label=name)
        if logx:
            ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        if xlabel:
            ax.set_xlabel(xlabel)
        if ylabel:
            ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        if len(ser) > 1:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
    text = text_line_plot(ser, title=title, logx=logx, logy=logy)
    return _text_fallback(text, path, quiet)
