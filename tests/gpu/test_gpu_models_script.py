"""benchmarks/gpu_models.py (the prepared run's models step) without a GPU: the pretrained
part finds a dense and a mixture-of-experts family in ``minitx.pretrained`` by itself and
shrinks each one's published config to a loadable small one of the same kind; its comparisons
fail on a wrong shape or a NaN as on a large error; and ``gpu_run.py``'s step reports a row that
disagrees, a part left out by the budget and the parts' summaries. (The script itself runs end
to end on the strict CuPy stand-in in ``tests/gpu/test_gpu_run.py``'s dry run.)"""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from support import REPO

import minitx.pretrained as pt
from minitx.models.decoder import check_config
from minitx.models.mixers import MIXERS
from minitx.pretrained.decoders import decoder_config
from minitx.pretrained.families import REPRESENTATIVE

BENCH = os.path.join(str(REPO), "benchmarks")


def _script(name):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.mark.parametrize("family", sorted(set(pt.DECODER_FAMILIES) & set(REPRESENTATIVE)))
def test_each_representative_config_shrinks_to_a_small_one_of_its_kind(family):
    g = _script("gpu_models")
    full = dict(REPRESENTATIVE[family][1], model_type=family)
    small = check_config(decoder_config(g.shrink(full), "shrunk"))
    big = check_config(decoder_config(full, "published"))
    assert small.num_layers == max(2, len(set(big.layer_types)))
    assert set(small.layer_types) == set(big.layer_types)        # every layer type kept
    assert small.hidden_size == g.SMALL["hidden_size"] and small.vocab_size == 97
    assert (small.num_kv_heads == small.num_heads) == (big.num_kv_heads == big.num_heads)
    assert g.kind_of(small, MIXERS) == g.kind_of(big, MIXERS)
    assert small.mlp == big.mlp and small.attention == big.attention


def test_the_families_cover_a_dense_and_a_moe_kind():
    g = _script("gpu_models")
    kinds = {g.kind_of(check_config(decoder_config(dict(REPRESENTATIVE[f][1], model_type=f),
                                                   f)), MIXERS)
             for f in set(pt.DECODER_FAMILIES) & set(REPRESENTATIVE)}
    assert {"dense", "MoE"} <= kinds <= set(g.KINDS)


def test_a_comparison_fails_on_a_wrong_shape_a_missing_array_or_a_nan():
    g = _script("gpu_models")
    a = np.array([1.0, -2.0, 4.0])
    assert g.relative(a, a) == 0.0 and g.verdict(0.0, g.TOL_F64) == "ok"
    assert g.relative(a + [0, 0, 4e-3], a) == pytest.approx(1e-3)
    assert g.verdict(g.relative(a + [0, 0, 4e-3], a), g.TOL_F32) == "FAIL"
    assert g.verdict(g.relative(a[:2], a), 1.0) == "FAIL"                      # shape
    assert g.verdict(g.relative(None, a), 1.0) == "FAIL"                       # missing grad
    assert g.relative(None, None) == 0.0                                       # both unused
    assert g.verdict(g.relative(np.array([1.0, np.nan, 4.0]), a), 1.0) == "FAIL"


def test_without_a_gpu_it_exits_2_naming_why_and_gpu_runs_arguments_parse():
    env = {k: v for k, v in os.environ.items()
           if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="")    # no GPU, even on a GPU machine
    p = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_models.py"), "--budget", "9"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "gpu_models: no usable GPU (" in p.stderr and "usage:" not in p.stderr


class _FakeRun:
    """The one thing step_models asks of gpu_run's Run: a command's (rc, text, s, timed out)."""
    dry = True

    def __init__(self, rc, text):
        self.answer = (rc, text, 1.0, False)
        self.cmd = None

    def py(self, *args, device=True):
        return list(args)

    def call(self, step, label, cmd, deadline, env=None):
        self.cmd = cmd
        return self.answer


def test_the_models_step_reports_disagreement_left_out_parts_and_summaries():
    import time
    r = _script("gpu_run")
    text = ("variants: ...\n  kda float64 max error 3.0e-02 (15 arrays)  FAIL\n"
            "SUMMARY variants: 7 of 8 agree with NumPy in float64 (worst 3.0e-02)\n"
            "budget: 1 parts not run: decoder mixtral-style\ncheck: SOMETHING DISAGREES\n")
    run = _FakeRun(1, text)
    res = r.step_models(run, 7, time.monotonic() + 17)
    assert res.status == "FAILED"
    assert "variants: 7 of 8 agree with NumPy in float64 (worst 3.0e-02)" in res.notes
    assert any("kda" in d and "FAIL" in d for d in res.details)
    assert any("1 parts left out by the step's budget: decoder mixtral-style" in d
               for d in res.details)
    assert "--budget" in run.cmd and "--quick" in run.cmd
    ok = r.step_models(_FakeRun(0, "SUMMARY decoders on CuPy: llama ...\n"), 7,
                       time.monotonic() + 17)
    assert ok.status == "OK" and ok.notes[-1] == "decoders on CuPy: llama ..."
    crashed = r.step_models(_FakeRun(1, "Traceback ...\nImportError: no module\n"), 7,
                            time.monotonic() + 17)
    assert crashed.status == "FAILED" and "exited 1" in crashed.details[0]
