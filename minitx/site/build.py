"""Building the site: the course, one page per source file, the docs, the notebooks, the index.

``build_site(out, seed=0, quick=False)`` writes a folder of static files:

- ``index.html`` — the course (the reading order below), then an appendix of the utilities;
- one page per source file (``minitx.ops.activation.html`` for ``minitx/ops/activation.py``):
  notes on the left, code on the right, section by section, and the live proofs
  (``proofs.py``) beside the code they prove;
- ``docs.cuda_kernel.html``, ``docs.pretrained.html`` and their images under ``img/``;
- one page per notebook (``notebooks/*.py``), executed;
- ``style.css``.

Everything is sorted and nothing depends on the clock, so two builds with the same seed are
byte-identical — except what measures the machine rather than the maths (wall-clock timings,
and peak traced memory, which moves by a few hundred bytes with the allocator's state): that
is fenced in ``<!--measured-->`` markers.
Every page links to the previous and next page of the course and to the pages it builds on
(the minitx modules it imports).
"""
from __future__ import annotations

import ast
import contextlib
import fnmatch
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field

from mdit_py_plugins.anchors import anchors_plugin

from minitx import backend, validate

from . import fast_twins
from . import proofs as proofs_mod
from .progress import Progress
from .render import (MathError, Renderer, docstring_markdown, esc, highlight_lines,
                     pygments_css, svg_plot)
from .source import file_sections, module_summary

try:      # the notebook runner (executes and caches notebooks; needs nbclient, jupytext)
    from . import notebooks as notebook_runner
    RUNNER_MISSING = None
    NOTEBOOK_ERRORS = (notebook_runner.NotebookExecutionError,)   # a cell raised, timed out
except ImportError as exc:       # its tools (nbclient, jupytext) are not installed
    notebook_runner, RUNNER_MISSING = None, f"the notebook runner ({exc})"
    NOTEBOOK_ERRORS = ()

__all__ = ["COURSE", "APPENDICES", "CHAPTER_BUDGET", "ENGINE_BUDGET", "Page", "build_site",
           "course_pages", "chapter_lines", "appendix_of", "page_url", "repo_root", "MathError"]

# The course: (chapter title, what the reader learns, [files]) in reading order. It starts at
# attention (by hand, then as five lines of code), walks through the engine those lines run on
# (the references only), and climbs from softmax to GPT, the variants, flash and the kernels.
# A notebook sits in the chapter it illustrates. Each chapter stays short enough to read at
# one sitting: its files total at most CHAPTER_BUDGET lines (the engine's, ENGINE_BUDGET).
COURSE = [
    ("Attention, by hand",
     "softmax(QKᵀ/√d_k)V worked through by hand, why we divide by √d_k, then the same "
     "formula as five lines of code.",
     ["notebooks/01_attention_by_hand.py", "minitx/attention/classic.py"]),
    ("The engine: Function → engine → Tensor",
     "What those five lines ran on: a Function is one op with its derivative, the engine "
     "walks the graph backwards, a Tensor remembers how it was made. The references only; "
     "the rest of the engine is an appendix.",
     ["minitx/autograd/function.py", "minitx/autograd/engine.py",
      "minitx/autograd/tensor.py"]),
    ("Softmax and its Jacobian", "The one nonlinearity of attention, and its derivative.",
     ["minitx/ops/activation.py"]),
    ("Scaled dot-product attention and its backward",
     "softmax(QKᵀ/√d_k)V, forward and backward, as one fused op; the contract every "
     "attention variant keeps.",
     ["minitx/ops/attention_maths.py", "minitx/ops/sdpa.py", "minitx/attention/base.py",
      "minitx/attention/exact.py"]),
    ("Multi-head attention and masks", "Heads, projections, masks, the KV cache.",
     ["minitx/models/multihead.py", "minitx/attention/masks.py",
      "minitx/attention/kv_cache.py"]),
    ("Positions", "Where a token is: sinusoids, learned tables, relative biases, rotations.",
     ["minitx/nn/positional.py", "minitx/attention/positions.py"]),
    ("The block and GPT",
     "Layers, normalisation, the transformer block, a GPT and its loss; then a small GPT "
     "trained on characters, and what its heads learned.",
     ["minitx/nn/layers.py", "minitx/ops/norm.py", "minitx/models/transformer.py",
      "minitx/models/common.py", "minitx/models/gpt.py", "minitx/ops/loss.py",
      "notebooks/03_char_gpt_heads.py"]),
    ("From GPT-2 to today's decoders",
     "Llama is GPT-2 with five switches flipped — RMSNorm, SwiGLU, RoPE, grouped-query "
     "attention, no biases — each shown as its diff and the number that was its reason; "
     "then every family as its file's diff from its parent, the blocks those switches "
     "bring in, and rotary positions with their scalings.",
     ["notebooks/06_llama_from_gpt2.py", "minitx/nn/decoder_layers.py",
      "minitx/nn/rotary.py"]),
    ("Today's decoders: mixtures of experts",
     "A router picks k of n expert MLPs for each token: the routers of Mixtral, gpt-oss and "
     "DeepSeek-V3, a dispatch in a few lines, the load-balancing loss.",
     ["docs/moe.md", "minitx/nn/moe.py"]),
    ("Today's decoders: one decoder, many families",
     "The one decoder whose switches make every family: its plain layer and attention, and "
     "what some families add to each (DeepSeek's latent attention is in the chapter on "
     "attention in current models).",
     ["minitx/models/decoder.py", "minitx/models/decoder_block.py",
      "minitx/models/decoder_attention.py", "minitx/models/block_features.py",
      "minitx/models/attention_features.py"]),
    ("Today's decoders: each family a file",
     "A family is its difference from its parent, GPT-2 at the root: the switches it flips, "
     "its config.json keys and tensor names in one table each (read both ways), HF's "
     "defaults for the keys a file leaves out, and its published sizes; the lineage and the "
     "families side by side, in tables generated from the files.",
     ["minitx/pretrained/families.py", "minitx/models/families/__init__.py",
      "minitx/models/families/base.py",
      *[f"minitx/models/families/{name}.py" for name in (
          "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3", "olmo2", "olmo3",
          "smollm3", "mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3", "deepseek_v32")]]),
    ("Today's decoders: the families side by side",
     "Every switch and what it changed since GPT-2, the real sizes counted from the "
     "configurations, HF's tensor names and config.json keys against minitx's, and the parity "
     "measured against transformers, family by family.",
     ["docs/decoders.md"]),
    ("Today's decoders: the hybrids",
     "Layers that are recurrences among attention layers — Qwen3-Next's gated DeltaNet, "
     "Kimi Linear's KDA, MiniMax's lightning attention — as layer types of the one decoder.",
     ["docs/hybrids.md", "minitx/models/mixers/__init__.py",
      "minitx/models/mixers/gated_deltanet.py", "minitx/models/mixers/kda.py",
      "minitx/models/mixers/lightning.py",
      "minitx/models/families/qwen3_next.py", "minitx/models/families/kimi_linear.py",
      "minitx/models/families/minimax.py"]),
    ("The attention of 2026: fewer keys, wider residuals",
     "Three ways the models of 2026 keep fewer keys: Llama 4's chunks, Gemma 4's keys shared "
     "across layers, and DeepSeek-V4's compressed attention, a window beside entries pooled "
     "over blocks of tokens, chosen by an indexer or all read; and DeepSeek-V4's "
     "hyper-connections, the residual stream widened to n streams.",
     ["minitx/attention/chunked.py", "minitx/attention/shared_kv.py",
      "minitx/attention/compressed.py", "minitx/nn/hyper_connections.py"]),
    ("The attention of 2026: blocks, convolutions, state spaces",
     "Qwen4-Exp's block indexer, LFM2's gated short convolution, and Mamba-2's selective "
     "state space on SSD's chunks, with Nemotron-H, whose layers are one sublayer each: "
     "Mamba-2, attention, a ReLU² MLP or a mixture of such experts in a latent space.",
     ["minitx/attention/block_indexer.py", "minitx/attention/short_conv.py",
      "minitx/attention/mamba2.py", "minitx/models/mixers/mamba2.py",
      "minitx/models/families/nemotron_h.py"]),
    ("Today's decoders: the families of 2026",
     "The families released in 2025 and 2026, each a file of its difference from its parent: "
     "MiniMax-M2 is Mixtral with OLMo 2's QK-norm, a rotated share and DeepSeek's sigmoid "
     "router; GLM-4.5 is DeepSeek-V3's experts under grouped-query attention; LFM2 is Llama "
     "whose layers are mostly gated short convolutions; nanochat is Llama without gains; "
     "Llama 4 chunks its rotary layers and warms its NoPE ones; Gemma 4 shares keys across "
     "layers; Qwen3.5 and OLMo-Hybrid are gated-DeltaNet hybrids. Then where the KV cache "
     "went, from MHA to a fixed state.",
     ["minitx/models/mixers/short_conv.py",
      "minitx/models/families/minimax_m2.py", "minitx/models/families/glm4_moe.py",
      "minitx/models/families/lfm2.py", "minitx/models/families/nanochat.py",
      "minitx/models/families/llama4.py", "minitx/models/families/gemma4.py",
      "minitx/models/families/qwen3_5.py", "minitx/models/families/olmo_hybrid.py",
      "notebooks/10_where_the_kv_cache_went.py"]),
    ("Efficient attention: sparse patterns", "Exact attention under a sparsity mask.",
     ["minitx/attention/sparse.py"]),
    ("Efficient attention: low rank",
     "Attend through k rows instead of N: Linformer's projection, Nyström's landmarks.",
     ["minitx/attention/linformer.py", "minitx/attention/nystrom.py"]),
    ("Efficient attention: kernels and linear attention",
     "Replace exp(q·k) by a feature map (Performer, linear attention).",
     ["minitx/attention/performer.py", "minitx/attention/linear.py"]),
    ("Efficient attention: hashing", "Attend within LSH buckets (Reformer).",
     ["minitx/attention/reformer.py"]),
    ("Efficient attention: clustering", "Attend within k-means clusters (Routing Transformer).",
     ["minitx/attention/routing.py"]),
    ("Efficient attention: synthetic and mixing",
     "Attention without q·k: Synthesizer, FNet, AFT.",
     ["minitx/attention/synthesizer.py", "minitx/attention/mixers.py"]),
    ("Attention in current models",
     "What recent models changed: latent keys and values (MLA, and the decoder's layer of "
     "it), the differential transformer, sigmoid attention, attention sinks.",
     ["minitx/attention/latent.py", "minitx/models/latent_attention.py",
      "minitx/attention/differential.py",
      "minitx/attention/sigmoid.py", "minitx/attention/sinks.py"]),
    ("Softmax attention with a gate",
     "Two 2025 gates: an output gate after the softmax (gated attention, Qwen3-Next) and a "
     "forget gate on the scores (the Forgetting Transformer).",
     ["minitx/attention/gated.py"]),
    ("Choosing keys",
     "Each query picks the keys it reads: DeepSeek's lightning indexer and top-k keys (and "
     "DeepSeek-V3.2's indexer in the decoder), MoBA's blocks ranked by their mean key, NSA's "
     "compressed, selected and window branches.",
     ["minitx/attention/selection.py", "minitx/models/indexer.py",
      "notebooks/07_choosing_keys.py"]),
    ("Attention as recurrence",
     "Linear attention read as a recurrent state: retention, the delta rule, state-space "
     "duality.",
     ["minitx/attention/retention.py", "minitx/attention/delta_rule.py",
      "minitx/attention/ssd.py", "notebooks/05_attention_and_recurrence.py"]),
    ("Attention as recurrence, decayed and gated",
     "The 2025 recurrences: lightning attention (retention's decay, computed in blocks), then "
     "from the delta rule to gated DeltaNet and Kimi Delta Attention: the memory decays, per "
     "head or per key channel, before each delta-rule write.",
     ["minitx/attention/lightning.py", "minitx/attention/gated_delta.py",
      "notebooks/08_state_against_n.py"]),
    ("Tiled flash attention in NumPy",
     "Exact attention in O(N) memory: the online softmax; which code computes attention; "
     "then what every efficient variant costs and gives up, measured.",
     ["minitx/ops/flash.py", "minitx/attention/flash.py", "minitx/ops/dispatch.py",
      "notebooks/02_efficient_attention.py"]),
    ("The CUDA kernel: naive",
     "The online softmax on a GPU, one thread per query row: the kernel to read first.",
     ["docs/gpu.md", "minitx/backend/kernels/flash_naive.cuh", "docs/cuda_kernel.md"]),
    ("The CUDA kernel: tiled",
     "Tiles in shared memory and registers, the CUDA-core kernels for float32.",
     ["minitx/backend/kernels/flash_common.cuh", "minitx/backend/kernels/flash_simt.cuh",
      "minitx/backend/kernels/flash_attn.cu"]),
    ("The CUDA kernel: tensor cores",
     "The same tiles on tensor cores for float16 (mma.sync, ldmatrix, cp.async).",
     ["minitx/backend/kernels/flash_tc.cuh"]),
    ("The CUDA kernel: float32 on tensor cores, and the launcher",
     "fp32 accuracy from tf32 tensor cores (the 3xTF32 split, three products for one), and the "
     "launcher that picks a kernel for each call.",
     ["minitx/backend/kernels/flash_tf32.cuh", "minitx/backend/flash_cuda.py"]),
    ("Real pretrained models", "BERT and GPT-2 checkpoints, read and run by minitx.",
     ["docs/pretrained.md", "minitx/pretrained/safetensors.py", "minitx/pretrained/common.py",
      "minitx/pretrained/bert.py", "minitx/pretrained/gpt2.py"]),
    ("Tokenizers, and a real BERT's heads",
     "Text to token ids (WordPiece, byte-level BPE); then every head of a pretrained BERT.",
     ["minitx/pretrained/tokenization.py", "minitx/pretrained/wordpiece.py",
      "minitx/pretrained/bpe.py", "notebooks/04_pretrained_bert.py"]),
    ("Look inside a model", "Hook points, caches, patching: what every head and variant computes.",
     ["docs/look_inside.md", "minitx/nn/hooks.py", "minitx/patching.py"]),
    ("A real LLM, text to text",
     "SmolLM2 and Gemma 3 from their GGUF files: the container and its block formats, "
     "llama.cpp's conventions undone, generation that streams and stops as a user expects.",
     ["docs/llm.md", "minitx/pretrained/gguf.py", "minitx/pretrained/gguf_load.py",
      "minitx/pretrained/generation.py", "minitx/chat.py"]),
    ("Inside a real LLM",
     "SmolLM2's attention sinks, previous-token and induction heads, the logit lens layer by "
     "layer, and the KV cache's bytes against the formula, all measured on the real weights.",
     ["docs/inside_llm.md", "notebooks/09_inside_a_real_llm.py"]),
]

CHAPTER_BUDGET = 1500       # lines (whole files, notes included) of a course chapter
ENGINE_BUDGET = 800         # … of the engine chapter: Function → engine → Tensor

# The appendices, after the course: (title, what is in it, [glob patterns]) — a file goes to
# the first appendix with a pattern that matches it; what is left goes to the last one.
APPENDICES = [
    ("Appendix: inside the engine",
     "What a first reader does not need: dtype and device rules, version counters, anomaly "
     "mode, gradient checks, checkpointing, the PyTorch spellings.",
     ["minitx/autograd/*.py"]),
    ("Appendix: the ops",
     "Every other primitive op (elementwise, reductions, shapes, indexing, linear algebra), "
     "each in its reference form.",
     ["minitx/ops/*.py", "minitx/functional.py"]),
    ("Appendix: modules, initialisation and more models",
     "The Module base class (parameters, state dicts, hooks), initialisation, the "
     "encoder–decoder, the classifier, reversible layers.",
     ["minitx/nn/*.py", "minitx/models/*.py"]),
    ("Appendix: How it was made fast",
     "The CPU speed tricks of minitx/fast/, each beside the reference it stands in for, with "
     "the speed-up this build measured. Switch them off with MINITX_FAST=0: the course's "
     "references then run alone.",
     ["minitx/fast/*.py", "minitx/configuration.py"]),
    ("Appendix: the project",
     "How minitx is built and proven: the layers and every file, the tests and their oracles, "
     "the benchmarks against PyTorch.",
     ["docs/*.md"]),
    ("Appendix: the utilities", "Everything else: backends, data, pictures, the programs.",
     ["minitx/**"]),
]


def repo_root() -> str:
    """The checkout that holds the ``minitx`` package (and docs/, notebooks/)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def page_url(path: str) -> str:
    """``minitx/ops/activation.py`` -> ``minitx.ops.activation.html`` (a flat site)."""
    stem = path[:-3] if path.endswith((".py", ".md")) else path
    return stem.replace("/", ".") + ".html"


def _appendix_files(root: str, course: set) -> list:
    """Every source file of the package, and every page of docs/, that the course does not
    list, sorted."""
    docs = os.path.join(root, "docs")
    found = [f"docs/{name}" for name in sorted(os.listdir(docs) if os.path.isdir(docs) else ())
             if name.endswith(".md") and f"docs/{name}" not in course]
    for folder, dirs, files in os.walk(os.path.join(root, "minitx")):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith((".py", ".cu", ".cuh")):
                rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                if rel not in course:
                    found.append(rel)
    return sorted(found)


def appendix_of(path: str) -> str:
    """The title of the appendix that holds ``path`` (the first whose pattern matches)."""
    for title, _, patterns in APPENDICES:
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns):
            return title
    return APPENDICES[-1][0]


def chapter_lines(root: str) -> list:
    """[(chapter title, lines, budget)] for the course's chapters: the whole-file line counts
    of the files each lists (notes included; a file not written yet counts 0)."""
    out = []
    for title, _, files in COURSE:
        total = 0
        for path in files:
            full = os.path.join(root, path)
            if os.path.exists(full):
                with open(full, encoding="utf-8") as fh:
                    total += sum(1 for _ in fh)
        budget = ENGINE_BUDGET if title.startswith("The engine") else CHAPTER_BUDGET
        out.append((title, total, budget))
    return out


@dataclass
class Page:
    path: str                      # source path relative to the repository, or notebook path
    title: str
    chapter: str = ""
    kind: str = "source"           # source | doc | notebook
    summary: str = ""
    builds_on: list = field(default_factory=list)
    prev: "Page" = None
    next: "Page" = None

    @property
    def url(self):
        return page_url(self.path)


def _notebooks(root):
    folder = os.path.join(root, "notebooks")
    if not os.path.isdir(folder):
        return []
    return sorted(f"notebooks/{n}" for n in os.listdir(folder)
                  if n.endswith(".py") and not n.startswith("_"))


MORE_NOTEBOOKS = ("More notebooks", "Notebooks not yet placed in a chapter, executed at this "
                  "build.")


def _kind(path):
    if path.startswith("notebooks/"):
        return "notebook"
    return "doc" if path.endswith(".md") else "source"


def course_pages(root: str):
    """(course pages in reading order, appendix pages) for the checkout at ``root``.

    A file the course lists but the checkout lacks is left out; a notebook the course does
    not list comes last, in "More notebooks". The appendix pages read in APPENDICES' order.
    """
    pages = []
    listed = set()
    for title, _, files in COURSE:
        for path in files:
            if os.path.exists(os.path.join(root, path)):
                pages.append(Page(path, path, chapter=title, kind=_kind(path)))
                listed.add(path)
    for path in _notebooks(root):
        if path not in listed:
            pages.append(Page(path, path, chapter=MORE_NOTEBOOKS[0], kind="notebook"))
    for a, b in zip(pages, pages[1:]):
        a.next, b.prev = b, a
    order = {title: n for n, (title, _, _) in enumerate(APPENDICES)}
    files = _appendix_files(root, listed)
    files.sort(key=lambda p: (order[appendix_of(p)], p))
    appendix = [Page(p, p, chapter=appendix_of(p), kind=_kind(p)) for p in files]
    for a, b in zip(appendix, appendix[1:]):     # the appendices read in their own order
        a.next, b.prev = b, a
    return pages, appendix


# ---- what a page builds on: the minitx modules it imports --------------------------------

def _module_path(root, dotted):
    base = os.path.join(root, *dotted.split("."))
    for cand in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.exists(cand):
            return os.path.relpath(cand, root).replace(os.sep, "/")
    return None


def imported_files(root: str, path: str, text: str) -> list:
    """The minitx source files that ``path`` imports (or ``#include``s), sorted."""
    found = set()
    if path.endswith((".cu", ".cuh")):
        for name in re.findall(r'#include\s+"([^"]+)"', text):
            found.add(os.path.dirname(path) + "/" + name)
        return sorted(found)
    package = path[:-3].replace("/", ".")
    if not path.endswith("__init__.py"):
        package = package.rsplit(".", 1)[0]
    else:
        package = package[: -len(".__init__")]
    for node in ast.walk(ast.parse(text)):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for dotted in names:
            if dotted.startswith("minitx"):
                hit = _module_path(root, dotted)
                if hit and hit != path:
                    found.add(hit)
    return sorted(found)


def code_linker(known, anchors=()):
    """``code_link`` for a page: a code span naming a site page (``minitx/ops/flash.py``,
    ``minitx.ops.flash``, or a file name found once, ``flash_attn.cu``) links to it; one
    naming a section of this page (``softmax_array``, ``Tensor.backward``) to its anchor."""
    modules = {p[:-3].replace("/", "."): p for p in known if p.endswith(".py")}
    modules.update({k[: -len(".__init__")]: v for k, v in modules.items()
                    if k.endswith(".__init__")})
    anchors = set(anchors)
    by_base = {}
    for p in known:
        by_base.setdefault(p.rsplit("/", 1)[-1], []).append(p)
    unique = {b: ps[0] for b, ps in by_base.items() if len(ps) == 1 and b != "__init__.py"}

    def link(text):
        text = text.strip()
        name = text[:-2] if text.endswith("()") else text
        if text in known or text in unique:
            return page_url(unique.get(text, text))
        if name in modules:
            return page_url(modules[name])
        if name in anchors:
            return "#" + name
        return None
    return link


# ---- page frame ---------------------------------------------------------------------------

def _frame(page_title, body, top, bottom="") -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{esc(page_title)} · minitx</title>\n"
            "<link rel=\"stylesheet\" href=\"style.css\">\n</head>\n<body>\n"
            f"{top}\n<main>\n{body}\n</main>\n{bottom}\n</body>\n</html>\n")


def _bar(page, position, total):
    where = (f'<span class="where">{esc(page.chapter)} · page {position} of {total}</span>'
             if position else f'<span class="where">{esc(page.chapter)}</span>')
    return (f'<header class="bar"><a class="home" href="index.html">minitx · read it</a>'
            f'{where}{_prevnext(page)}</header>')


def _prevnext(page):
    prev = (f'<a rel="prev" href="{page.prev.url}">← {esc(page.prev.title)}</a>' if page.prev
            else '<span></span>')
    nxt = (f'<a rel="next" href="{page.next.url}">{esc(page.next.title)} →</a>' if page.next
           else '<span></span>')
    return f'<nav class="prevnext">{prev}{nxt}</nav>'


def _meta(page, known, seed, commit):
    links = [f'<a href="{page_url(p)}">{esc(p)}</a>' for p in page.builds_on if p in known]
    on = f'<p class="builds">Builds on: {", ".join(links)}</p>' if links else ""
    return (f'{on}<p class="stamp">Built from commit <code>{esc(commit)}</code> with seed '
            f'{seed}; every number in a proof box was computed by that build.</p>')


# ---- proof boxes --------------------------------------------------------------------------

CLOCK_NOTE = (
    "Growth is proven by the counts: floating-point operations counted from the shapes of "
    "every product and element-wise step, and the bytes tracemalloc traces. The time plot "
    "(CPU time on one thread, the best of 3 loops after a warm-up, on this machine during "
    "this build) shows what one call costs here; it cannot show how the cost grows: at these "
    "N a call's fixed overhead (Python, allocation) weighs as much as the arithmetic, and "
    "caches and other processes move it from one build to the next.")


def _proof_html(proof) -> str:
    rows = []
    for claim, value, limit, passed, measured in proof.lines:
        if limit == "illustrative":       # a clock's number: shown, labelled, never judged
            verdict = '<span class="limit illustrative">illustrative</span>'
        else:
            verdict = (f'<span class="limit">{esc(limit)} {"✓" if passed else "✗"}</span>'
                       if limit else "")
        row = (f'<li><span class="claim">{esc(claim)}</span>'
               f'<span class="value"><b>{esc(value)}</b>{verdict}</span></li>')
        rows.append(f"<!--measured-->{row}<!--/measured-->" if measured else row)
    parts = [f'<aside class="proof" id="proof-{esc(proof.name)}">'
             f'<p class="proof-title">Proof, computed at build: <code>{esc(proof.name)}</code></p>']
    if proof.note:
        parts.append(f'<p class="note">{esc(proof.note)}</p>')
    parts.append(f'<ul class="claims">{"".join(rows)}</ul>')
    plots = []
    if proof.flops:        # a count: the same on every machine, so not fenced
        plots.append(svg_plot({"counted FLOPs": proof.flops}, "N", "floating-point operations",
                              unit="n"))
    if proof.memory:       # traced peaks move by a few hundred bytes with the allocator's state
        plots.append("<!--measured-->" + svg_plot({"peak traced memory": proof.memory}, "N",
                                                  "bytes", unit="B") + "<!--/measured-->")
    if proof.time:
        plots.append("<!--measured-->" + svg_plot({"CPU time, measured": proof.time}, "N",
                                                  "seconds", unit="s") + "<!--/measured-->")
    if proof.budget:
        plots.append(svg_plot({"output error": [(b, e) for b, e in proof.budget if e > 0]},
                              proof.budget_label, "relative error"))
    if plots:
        parts.append(f'<div class="plots">{"".join(plots)}</div>')
    if proof.time:
        parts.append(f'<p class="note">{esc(CLOCK_NOTE)}</p>')
    parts.append("</aside>")
    return "".join(parts)


# ---- the fast layer beside its references -------------------------------------------------

def _speedup_html(twin) -> str:
    if twin.speedup is None:
        return '<span class="value">not measured in this build</span>'
    fast, plain = twin.times
    return (f'<!--measured--><span class="value"><b>×{twin.speedup:.2f}</b> '
            f'({fast * 1e3:.2f} ms with it, {plain * 1e3:.2f} ms without)</span><!--/measured-->')


def _twin_notes(twins, known) -> dict:
    """{page path: {anchor: [box HTML]}}: on a twin's page, beside the twin, a box naming
    its reference and the speed-up this build measured; on the reference's page, beside the
    dispatch point, a box naming the twin."""
    notes = {}
    for tw in twins:
        if tw.fast_path not in known:
            continue
        ref = (f'<a href="{page_url(tw.ref_path)}#{esc(tw.ref_anchor)}"><code>{esc(tw.ref_path)}'
               f'</code> · <code>{esc(tw.ref_anchor)}</code></a>' if tw.ref_path in known
               else "no dispatch point found")
        notes.setdefault(tw.fast_path, {}).setdefault(tw.fast_anchor, []).append(
            f'<aside class="twin" id="twin-{esc(tw.name)}"><p class="proof-title">Fast twin of '
            f'<code>{esc(tw.name)}</code></p><p>The reference it stands in for: {ref}. '
            f'Speed-up measured by this build (the same workload with every twin on, then with '
            f'this one off): {_speedup_html(tw)}</p></aside>')
        if tw.ref_path in known:
            notes.setdefault(tw.ref_path, {}).setdefault(tw.ref_anchor, []).append(
                f'<aside class="twin"><p>With the fast layer on (the default) this dispatch '
                f'point runs the fast twin <a href="{page_url(tw.fast_path)}#twin-'
                f'{esc(tw.name)}"><code>{esc(tw.fast_path)}</code> · '
                f'<code>{esc(tw.fast_anchor)}</code></a> (appendix “How it was made fast”); '
                f'<code>MINITX_FAST=0</code> runs the reference, the code on this page.</p>'
                f'</aside>')
    return notes


def _twin_table(twins, known) -> str:
    """The fast appendix's table: each twin, its reference, the measured speed-up."""
    rows = []
    for tw in twins:
        if tw.fast_path not in known:
            continue
        ref = (f'<a href="{page_url(tw.ref_path)}#{esc(tw.ref_anchor)}">{esc(tw.ref_anchor)}</a>'
               if tw.ref_path in known else "—")
        rows.append(f'<tr><td><a href="{page_url(tw.fast_path)}#twin-{esc(tw.name)}">'
                    f'{esc(tw.name)}</a></td><td>{ref}</td><td>{_speedup_html(tw)}</td></tr>')
    if not rows:
        return ""
    return ('<div class="scroll"><table class="twins"><thead><tr><th>twin</th>'
            '<th>reference</th><th>speed-up measured by this build</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table></div>")


# ---- source pages -------------------------------------------------------------------------

def source_body(page, text, renderer, proofs=(), known=(), side=None) -> str:
    """The sections of one source file as HTML rows (prose | code). ``side`` maps a section
    anchor to HTML shown under that section's notes (the fast layer's twin boxes)."""
    side = side or {}
    language = "cuda" if page.path.endswith((".cu", ".cuh")) else "python"
    sections = file_sections(page.path, text)
    renderer.code_link = code_linker(known, [s.anchor for s in sections] +
                                     [n for s in sections for n in s.names])
    lines = highlight_lines(text, language)
    by_anchor = {}
    for proof in proofs:
        by_anchor.setdefault(proof.anchor, []).append(proof)
    anchors = {s.anchor for s in sections} | {n for s in sections for n in s.names}
    homeless = [p for a, ps in by_anchor.items() if a not in anchors for p in ps]
    out, line_no = [], 0
    for k, sec in enumerate(sections):
        head = lines[line_no:line_no + len(sec.head_src)]
        line_no += len(sec.head_src) + len(sec.prose_src)
        code = lines[line_no:line_no + len(sec.code_src)]
        line_no += len(sec.code_src)
        prose = docstring_markdown(sec.prose)
        notes = renderer(prose) if prose.strip() else ""
        boxes = [p for n in [sec.anchor] + sec.names for p in by_anchor.get(n, [])]
        if k == 0:
            boxes += homeless
        extra = "".join(f'<span id="{esc(n)}"></span>' for n in sec.names)
        code_html = "".join(head + code)
        label = f'<a class="anchor" href="#{esc(sec.anchor)}">§</a>'
        out.append(
            f'<section class="sec" id="{esc(sec.anchor)}">{extra}'
            f'<div class="prose" data-src="{esc("".join(sec.prose_src))}">{label}{notes}'
            f'{"".join(_proof_html(p) for p in boxes)}'
            f'{"".join(h for n in [sec.anchor] + sec.names for h in side.get(n, ()))}</div>'
            f'<div class="code" data-head="{len(sec.head_src)}"><pre>{code_html}</pre></div>'
            f'</section>')
    return "\n".join(out)


def _source_page(page, root, renderer, proofs, known, seed, commit, position, total,
                 notes=None):
    with open(os.path.join(root, page.path), encoding="utf-8", newline="") as fh:
        text = fh.read()
    page.builds_on = imported_files(root, page.path, text)
    body = source_body(page, text, renderer, proofs, known, notes)
    head = (f'<div class="pagehead"><h1><code>{esc(page.path)}</code></h1>'
            f'{_meta(page, known, seed, commit)}{_contents(page.path, text)}</div>')
    return _frame(page.path, head + '<div class="sections">' + body + "</div>",
                  _bar(page, position, total), _footer(page))


def _contents(path, text):
    """"On this page": a link to each class and function that has its own section."""
    names = []
    for sec in file_sections(path, text):
        names += [sec.anchor] if sec.head_src else []
        names += sec.names
    names = [n for n in names if not n.startswith("_") and "._" not in n]
    if not names:
        return ""
    links = " · ".join(f'<a href="#{esc(n)}">{esc(n)}</a>' for n in names)
    return f'<p class="contents">On this page: {links}</p>'


def _footer(page):
    return f'<footer class="foot">{_prevnext(page)}</footer>'


# ---- docs pages ---------------------------------------------------------------------------

def _doc_page(page, root, out, known, seed, commit, position, total):
    with open(os.path.join(root, page.path), encoding="utf-8") as fh:
        text = fh.read()
    folder = os.path.dirname(page.path)

    def image(src):
        if re.match(r"^([a-z]+:|//|/)", src):
            return None
        source = os.path.normpath(os.path.join(root, folder, src))
        if not os.path.exists(source):
            return None
        dest = os.path.join("img", os.path.basename(source))
        os.makedirs(os.path.join(out, "img"), exist_ok=True)
        shutil.copyfile(source, os.path.join(out, dest))
        return dest

    def link(href):
        target, _, frag = href.partition("#")
        if not target:
            return href
        if re.match(r"^([a-z]+:|//|/)", target):
            return None
        rel = os.path.normpath(os.path.join(folder, target)).replace(os.sep, "/")
        if rel in known:
            return page_url(rel) + (f"#{frag}" if frag else "")
        return None

    renderer = Renderer(page.path, link=link, image=image, code_link=code_linker(known))
    renderer.md.use(anchors_plugin, max_level=3)
    body = f'<article class="doc">{renderer(text)}</article>'
    page.builds_on = sorted(p for p in known if p.startswith("minitx/") and p in text)
    head = f'<div class="pagehead">{_meta(page, known, seed, commit)}</div>'
    return _frame(page.path, head + body, _bar(page, position, total), _footer(page)), renderer


# ---- notebooks ----------------------------------------------------------------------------

NOTEBOOK_MODES = ("run", "reuse", "skip")


def _not_run(path, why):
    import jupytext  # noqa: PLC0415 - notebook pages only
    return jupytext.read(path), (f'<p class="banner">Not executed in this build — {esc(why)}. '
                                 'The code is shown as written, without outputs.</p>')


def _run_notebook(page, root, cache_dir, quick, seed, mode="run", cell_timeout=600):
    """(the executed notebook, "", what the log says) — or, when it is not executed (what it
    needs is missing, ``mode`` "skip", or "reuse" without an earlier execution in
    ``cache_dir``), (the notebook as written, a banner saying why, the reason)."""
    path = os.path.join(root, page.path)
    if mode == "skip":
        why = "the build was asked not to run the notebooks (--notebooks skip)"
        return (*_not_run(path, why), why)
    missing = (notebook_runner.notebook_requirements_missing(path) if notebook_runner
               else RUNNER_MISSING)
    if missing:
        return (*_not_run(path, missing), missing)
    if mode == "reuse":
        nb = notebook_runner.cached_notebook(path, quick=quick, seed=seed, cache_dir=cache_dir)
        if nb is None:
            why = (f"no earlier execution of this source (quick={quick}, seed {seed}) in "
                   f"{cache_dir} to reuse (--notebooks reuse); --notebooks run executes it")
            return (*_not_run(path, why), why)
        return nb, "", f"reused from {cache_dir}"
    nb = notebook_runner.cached_notebook(path, quick=quick, seed=seed, cache_dir=cache_dir)
    if nb is not None:        # executed by an earlier build: the log says so, not "(0.0 s)"
        return nb, "", f"executed earlier, read back from {cache_dir}"
    return notebook_runner.execute_notebook(path, quick=quick, seed=seed, cache_dir=cache_dir,
                                            timeout=cell_timeout), "", ""


def _notebook_page(page, executed, renderer, seed, commit, known, position, total):
    nb, banner = executed
    cells = notebook_html(nb, renderer, page.path)
    head = (f'<div class="pagehead"><h1><code>{esc(page.path)}</code></h1>{banner}'
            f'{_meta(page, known, seed, commit)}</div>')
    return _frame(page.path, head + '<article class="notebook">' + cells + "</article>",
                  _bar(page, position, total), _footer(page))


def merged_streams(outputs) -> list:
    """``outputs`` with each run of consecutive stream outputs of one stream (stdout, stderr)
    joined into one: how the kernel splits printed lines into messages depends on timing, so
    the same prints arrive as one block in one run and three in the next."""
    merged = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and last is not None
                and last.get("output_type") == "stream" and last.get("name") == output.get("name")):
            merged[-1] = dict(last, text=last.get("text", "") + output.get("text", ""))
        else:
            merged.append(output)
    return merged


def notebook_html(nb, renderer, path) -> str:
    """The cells of an (executed) notebook as HTML: Markdown cells with maths, highlighted
    code, stream and text outputs, PNG/SVG figures inline. Outputs of cells tagged
    ``measured`` (wall-clock timings) are fenced in ``<!--measured-->`` markers. An error
    output raises ``NotebookError``."""
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            cells.append(f'<div class="nb-md" id="cell-{i}">{renderer(cell.source)}</div>')
            continue
        if cell.cell_type != "code":
            continue
        code = "".join(highlight_lines(cell.source, "python"))
        block = "".join(_output_html(output, path, i)
                        for output in merged_streams(cell.get("outputs", [])))
        if block and "measured" in cell.get("metadata", {}).get("tags", []):
            block = f"<!--measured-->{block}<!--/measured-->"
        cells.append(f'<div class="nb-code" id="cell-{i}"><pre class="code">{code}</pre>'
                     f'{block}</div>')
    return "\n".join(cells)


class NotebookError(RuntimeError):
    """An error output in an executed notebook fails the build."""


def _output_html(output, path, index):
    kind = output.get("output_type")
    if kind == "error":
        raise NotebookError(f"notebook {path}, cell {index}: {output.get('ename')}: "
                            f"{output.get('evalue')}")
    if kind == "stream":
        return f'<pre class="nb-out">{esc(output.get("text", ""))}</pre>'
    data = output.get("data", {})
    if "image/png" in data:
        png = data["image/png"].replace("\n", "")
        return f'<img class="nb-img" alt="figure" src="data:image/png;base64,{png}">'
    if "image/svg+xml" in data:
        svg = data["image/svg+xml"]
        return f'<div class="nb-svg">{svg if isinstance(svg, str) else "".join(svg)}</div>'
    if "text/plain" in data:
        text = data["text/plain"]
        return f'<pre class="nb-out">{esc(text if isinstance(text, str) else "".join(text))}</pre>'
    return ""


# ---- index --------------------------------------------------------------------------------

def _page_list(items, summaries):
    return "".join(f'<li><a href="{p.url}">{esc(p.path)}</a>'
                   f'<span class="sum">{summaries.get(p.path, "")}</span></li>' for p in items)


def appendix_id(title: str) -> str:
    """``Appendix: inside the engine`` -> ``appendix-inside-the-engine`` (the index anchor)."""
    return "appendix-" + "-".join(re.findall(r"[a-z0-9]+", title.lower().split(":", 1)[-1]))


def _index(pages, appendix, summaries, seed, commit, formulas_note, extra=None):
    """The index: the course chapter by chapter, then each appendix; ``extra`` maps an
    appendix title to HTML shown under its description (the fast layer's table)."""
    inline = Renderer("index.html").md.renderInline
    summaries = {k: inline(docstring_markdown(v)) for k, v in summaries.items()}
    extra = extra or {}
    chapters = []
    by_chapter = {}
    for p in pages + appendix:
        by_chapter.setdefault(p.chapter, []).append(p)
    for n, (title, learn, _) in enumerate(COURSE + [MORE_NOTEBOOKS + ([],)], 1):
        items = by_chapter.get(title, [])
        if not items:
            continue
        chapters.append(f'<li class="chapter"><h2>{n}. {esc(title)}</h2><p>{esc(learn)}</p>'
                        f'<ol>{_page_list(items, summaries)}</ol></li>')
    appendices = []
    for title, what, _ in APPENDICES:
        items = by_chapter.get(title, [])
        if items:
            appendices.append(
                f'<section class="appendix" id="{appendix_id(title)}"><h2>{esc(title)}</h2>'
                f'<p>{esc(what)}</p>{extra.get(title, "")}'
                f'<ul>{_page_list(items, summaries)}</ul></section>')
    first = pages[0]
    body = (
        '<div class="intro"><h1>minitx, read it</h1>'
        "<p>Attention and transformers from scratch, in NumPy, read as a course that starts "
        "at attention itself. Each page is one source file of minitx: the notes (docstrings "
        "and comments) on the left, the code they explain on the right — all of it, generated "
        "from the files themselves. Beside the ops and every attention variant, a proof box "
        "shows numbers this build computed: a float64 gradient check, the error against the "
        "reference, and how the counted work and the traced memory grow with N. What a first "
        "reading can skip is in the "
        "appendices at the end.</p>"
        f'<p>Start with <a href="{first.url}">{esc(first.path)}</a> and follow “next →”.</p>'
        f'<p class="stamp">Built from commit <code>{esc(commit)}</code> with seed {seed}. '
        f"{esc(formulas_note)}</p></div>"
        f'<ol class="course">{"".join(chapters)}</ol>'
        f'<div id="appendix">{"".join(appendices)}</div>')
    top = ('<header class="bar"><a class="home" href="index.html">minitx · read it</a>'
           f'<span class="where">the course: {len(pages)} pages</span>'
           f'<nav class="prevnext"><span></span><a rel="next" href="{first.url}">'
           f'{esc(first.path)} →</a></nav></header>')
    return _frame("the course", body, top)


# ---- the build ----------------------------------------------------------------------------

def _commit(root):
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True, timeout=20).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _write(path, text):
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


@contextlib.contextmanager
def numpy_backend():
    """The build computes on NumPy whatever ``MINITX_BACKEND`` says: its proofs compare
    against NumPy references and its notebooks run on NumPy (``notebooks._kernel_env``), so a
    site built in a GPU user's shell (``MINITX_BACKEND=cupy``) shows the same pages. The
    backend is set back when the build ends."""
    before = backend.get_backend()
    if before != "numpy":
        backend.set_backend("numpy")
    try:
        yield
    finally:
        if backend.get_backend() != before:
            backend.set_backend(before)


def build_site(out: str, seed: int = 0, quick: bool = False, root: str = None,
               cache_dir: str = None, log=print, notebooks: bool = True,
               proofs: bool = True, bars=None, notebook_mode: str = "run",
               cell_timeout: int = 600) -> dict:
    """Build the site into ``out``; returns {pages, formulas, seconds, proofs, twins}.

    ``notebooks=False`` leaves the notebook pages out (their tools are missing).
    ``notebook_mode``: "run" executes each notebook (each cell within ``cell_timeout``
    seconds; with ``cache_dir``, an execution kept there for the same source, setting and seed
    is read back instead); "reuse" only reads such kept executions back, never executing;
    "skip" executes none. A notebook not executed keeps its page, its code shown as written
    under a banner that says why, and the build log says so.

    ``proofs=False`` leaves the proof boxes out and measures no fast twin (for tests of the
    rest of the build). The build says what it is doing through ``log`` (or tqdm bars:
    ``bars``, see ``progress.Progress``) and computes on NumPy (``numpy_backend``).
    Raises ``MathError`` (a formula that does not parse), ``proofs.ProofFailure`` (a proof
    below its threshold) or ``NotebookError`` (an error output in a notebook).
    """
    validate.choice(notebook_mode, "notebook_mode", NOTEBOOK_MODES, owner="build_site")
    validate.positive_int(cell_timeout, "cell_timeout", owner="build_site")
    progress = Progress(log, bars)
    with numpy_backend():
        return _build(out, seed, quick, root or repo_root(), cache_dir, notebooks, proofs,
                      progress, notebook_mode, cell_timeout)


def _fast_layer(root, everything, known, measure, quick, seed, progress):
    """The fast twins (``fast_twins.Twin``) whose pages this site has; measured if asked."""
    if not any(p.startswith("minitx/fast/") for p in known):
        return []

    def anchors_of(path):
        if path not in known:
            return set()
        with open(os.path.join(root, path), encoding="utf-8") as fh:
            sections = file_sections(path, fh.read())
        return {s.anchor for s in sections} | {n for s in sections for n in s.names}
    twins = fast_twins.find_twins(root, [p.path for p in everything], anchors_of)
    if measure:
        fast_twins.measure(twins, quick=quick, seed=seed)
        progress.say(f"fast layer: {len(twins)} twins, each timed with and without it")
    return twins


def _build(out, seed, quick, root, cache_dir, notebooks, proofs, progress, notebook_mode="run",
           cell_timeout=600):
    os.makedirs(out, exist_ok=True)
    commit = _commit(root)
    pages, appendix = course_pages(root)
    if not notebooks:
        pages = [p for p in pages if p.kind != "notebook"]
        for a, b in zip([None] + pages, pages + [None]):
            if a:
                a.next = b
            if b:
                b.prev = a
    everything = pages + appendix
    known = {p.path for p in everything}
    progress.say(f"proofs: computing ({'quick' if quick else 'full'} sizes, seed {seed}) …")
    all_proofs = proofs_mod.all_proofs(quick=quick, seed=seed) if proofs else {}
    n_proofs = sum(len(v) for v in all_proofs.values())
    progress.say(f"proofs: {n_proofs} computed")
    twins = _fast_layer(root, everything, known, proofs, quick, seed, progress)
    notes = _twin_notes(twins, known)
    executed = {}
    books = [p for p in pages if p.kind == "notebook"]
    with progress.stage("notebooks", len(books)) as tick:
        for page in books:
            started = time.perf_counter()
            nb, banner, said = _run_notebook(page, root, cache_dir, quick, seed, notebook_mode,
                                             cell_timeout)
            executed[page.path] = nb, banner
            seconds = time.perf_counter() - started
            tick(f"{page.path}: NOT EXECUTED — {said}" if banner else
                 f"{page.path} ({said})" if said else f"{page.path} ({seconds:.1f} s)")
    summaries, formulas = {}, 0
    with progress.stage("pages", len(everything) + 1, every=25) as tick:
        for position, page in enumerate(everything, 1):
            pos = position if position <= len(pages) else 0
            if page.kind == "doc":
                html, renderer = _doc_page(page, root, out, known, seed, commit, pos,
                                           len(pages))
                summaries[page.path] = _first_heading(root, page.path)
            else:
                renderer = Renderer(page.path, code_link=code_linker(known))
                if page.kind == "notebook":
                    summaries[page.path] = _notebook_title(root, page.path)
                    html = _notebook_page(page, executed[page.path], renderer, seed, commit,
                                          known, pos, len(pages))
                else:
                    with open(os.path.join(root, page.path), encoding="utf-8") as fh:
                        text = fh.read()
                    summaries[page.path] = (module_summary(text) if page.path.endswith(".py")
                                            else _first_comment(text))
                    html = _source_page(page, root, renderer, all_proofs.get(page.path, ()),
                                        known, seed, commit, pos, len(pages),
                                        notes.get(page.path))
            formulas += renderer.formulas
            _write(os.path.join(out, page.url), html)
            tick(page.path)
        note = (f"{len(everything) + 1} pages in all: the course's {len(pages)}, "
                f"{len(appendix)} in the appendices and this index; {formulas} "
                f"formula{'s' * (formulas != 1)} rendered to MathML.")
        extra = {"Appendix: How it was made fast": _twin_table(twins, known)}
        _write(os.path.join(out, "index.html"), _index(pages, appendix, summaries, seed, commit,
                                                       note, extra))
        _write(os.path.join(out, "style.css"), STYLE + pygments_css())
        tick("index.html")
    seconds = progress.elapsed()
    progress.say(f"site: {len(everything) + 1} pages, {formulas} formulas, {n_proofs} proofs, "
                 f"{len(books)} notebooks, {seconds:.1f} s -> {os.path.abspath(out)}")
    return {"pages": len(everything) + 1, "formulas": formulas, "seconds": seconds,
            "proofs": n_proofs, "twins": len(twins)}


def _notebook_title(root, path):
    """The first Markdown heading of a percent-format notebook (``# # Title``), or ""."""
    with open(os.path.join(root, path), encoding="utf-8") as fh:
        for line in fh:
            m = re.match(r"^# #+ (.+)$", line)
            if m:
                return m.group(1).strip()
    return ""


def _first_heading(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("# "):
                return line[2:].strip()
    return ""


def _first_comment(text):
    m = re.search(r"^\s*(?://|/\*)\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else ""


STYLE = """\
:root { --ink: #1d1d1f; --muted: #5b5b66; --rule: #e3e3e8; --accent: #1f5fa8;
        --code-bg: #f7f7f9; --prose-w: 40%; }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 16px/1.6 "Iowan Old Style", "Charter", "Georgia", "DejaVu Serif", serif; }
code, pre, .bar { font-family: "DejaVu Sans Mono", "Menlo", "Consolas", monospace; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
.bar { position: sticky; top: 0; z-index: 5; display: flex; flex-wrap: wrap; gap: .3rem 1rem;
       align-items: center; padding: .45rem 1rem; background: #fbfbfd; font-size: 13px;
       border-bottom: 1px solid var(--rule); }
.bar .home { font-weight: 700; color: var(--ink); }
.bar .where { color: var(--muted); }
.prevnext { display: flex; justify-content: space-between; gap: 1rem; margin-left: auto; }
.prevnext a { overflow-wrap: anywhere; }
main { max-width: 1500px; margin: 0 auto; padding: 0 1rem 2rem; }
.pagehead { padding: 1rem 0 .5rem; border-bottom: 1px solid var(--rule); }
.pagehead h1 { font-size: 1.4rem; margin: .2rem 0; overflow-wrap: anywhere; }
.builds, .stamp, .contents { color: var(--muted); font-size: 14px; margin: .25rem 0; }
.contents a { overflow-wrap: anywhere; }
.sec { scroll-margin-top: 3rem; display: flex; align-items: stretch;
       border-bottom: 1px solid var(--rule); }
.prose { flex: 0 0 var(--prose-w); min-width: 0; padding: .6rem 1.2rem .6rem 0; position: relative;
         overflow-wrap: break-word; }
.code { flex: 1 1 auto; min-width: 0; background: var(--code-bg);
        border-left: 1px solid var(--rule); }
.code pre { margin: 0; padding: .6rem .9rem; overflow-x: auto; font-size: 13px; line-height: 1.5;
            scrollbar-width: thin; scrollbar-color: #9aa6b8 transparent; }
.prose pre { overflow-x: auto; background: var(--code-bg); padding: .5rem .7rem; font-size: 13px;
             border-radius: 4px; }
.prose code, .doc code, .notebook code { overflow-wrap: anywhere; }
.prose code, .doc code { font-size: .88em; background: #f1f1f4; padding: 0 .2em;
                         border-radius: 3px; }
.prose pre code, .doc pre code { background: none; padding: 0; }
a.ref code { color: var(--accent); }
.prose h1, .prose h2, .prose h3 { font-size: 1.1rem; margin: .4rem 0; }
.prose p:first-of-type { margin-top: .2rem; }
.anchor { position: absolute; left: -1rem; top: .6rem; color: #bbb; font-size: 13px; }
.math { overflow-x: auto; overflow-y: hidden; margin: .6rem 0; padding: .1rem 0 .3rem; }
/* What is wider than its column scrolls inside its own box, and says so: a visible thin
   scrollbar, and a shadow on the side where more is hidden (covers that scroll with the
   content hide the shadow at either end). Nothing is clipped. */
.math, .prose pre, .doc pre, .notebook pre, .nb-md pre, .scroll, .proof, .doc table,
.notebook table, .prose table {
  scrollbar-width: thin; scrollbar-color: #9aa6b8 transparent;
  background:
    linear-gradient(to right, var(--bg, #fff) 30%, rgba(255,255,255,0)) left / 1.5rem 100%
      no-repeat local,
    linear-gradient(to left, var(--bg, #fff) 30%, rgba(255,255,255,0)) right / 1.5rem 100%
      no-repeat local,
    radial-gradient(farthest-side at 0 50%, rgba(0,0,0,.2), rgba(0,0,0,0)) left / .7rem 100%
      no-repeat scroll,
    radial-gradient(farthest-side at 100% 50%, rgba(0,0,0,.2), rgba(0,0,0,0)) right / .7rem
      100% no-repeat scroll,
    var(--bg, #fff); }
.prose pre, .doc pre, .notebook pre, .nb-md pre { --bg: var(--code-bg); }
.proof { --bg: #f5f9fe; }
.scroll { overflow-x: auto; max-width: 100%; }
table.twins { border-collapse: collapse; font-size: 14px; margin: .4rem 0; }
table.twins td, table.twins th { border: 1px solid var(--rule); padding: .2rem .5rem;
                                 text-align: left; }
.twin { margin: .8rem 0; padding: .6rem .8rem; border: 1px solid #d9e7d0; border-radius: 6px;
        background: #f6fbf3; font-size: 13px; overflow-wrap: anywhere; }
.twin p { margin: .2rem 0; }
math { font-size: 1.08em; }
.proof { margin: .8rem 0; padding: .6rem .8rem; border: 1px solid #cfe0f5; border-radius: 6px;
         font-size: 13px; overflow-x: auto; }
.proof-title { margin: 0 0 .3rem; font-weight: 700; }
.proof .note { margin: .2rem 0 .4rem; color: var(--muted); }
.claims { list-style: none; margin: 0; padding: 0; }
.claims li { display: flex; flex-wrap: wrap; justify-content: space-between; gap: 0 .8rem;
             padding: .2rem 0; border-bottom: 1px solid #e2ecf8; }
.claims .claim { flex: 1 1 14rem; min-width: 0; overflow-wrap: anywhere; }
.claims .value { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; white-space: nowrap; }
.claims .limit { color: var(--muted); margin-left: .5rem; }
.plots { display: flex; flex-wrap: wrap; gap: .5rem; margin-top: .5rem; }
.plots svg.plot { flex: 0 1 240px; min-width: 0; }
svg.plot { max-width: 100%; height: auto; font: 10px sans-serif; }
.doc, .notebook, .intro, .course, .appendix { max-width: 920px; }
.doc img, .notebook img { max-width: 100%; height: auto; }
.doc table, .notebook table, .prose table { border-collapse: collapse; display: block;
             max-width: 100%; overflow-x: auto; font-size: 14px; }
.doc td, .doc th, .notebook td, .notebook th, .prose td, .prose th {
  border: 1px solid var(--rule); padding: .2rem .5rem; }
.doc pre, .notebook pre { padding: .6rem .8rem; overflow-x: auto; font-size: 13px; }
.nb-out { border-left: 3px solid #cfe0f5; }
.banner { background: #fff6e0; border: 1px solid #f0d48a; padding: .5rem .8rem; }
.outside + .address { color: var(--muted); font-size: .85em; overflow-wrap: anywhere; }
.course { padding-left: 0; list-style: none; }
.course h2 { font-size: 1.15rem; margin: 1.4rem 0 .2rem; }
.course li li, .appendix li { margin: .15rem 0; }
.course a, .appendix a, .builds a { overflow-wrap: anywhere; }
.sum { display: block; color: var(--muted); font-size: 14px; }
.foot { border-top: 1px solid var(--rule); padding: .8rem 1rem; font-size: 13px; }
@media (max-width: 800px) {
  .bar { position: static; }
  .sec { flex-direction: column; }
  .prose { padding: .6rem 0; }
  .code { border-left: 0; }
  .anchor { display: none; }
  .prevnext { margin-left: 0; width: 100%; }
}
"""
