"""How often minitx makes the host wait for the device, counted on the strict CuPy stand-in.

On a GPU every copy to the host, every Python value read from an array (``bool``, ``int``,
``.item()``) and every output whose size depends on the data (a boolean mask's selection,
``nonzero``) is a round trip that stalls the queue of kernels; the stand-in counts each
(``strict_cupy.counting_syncs``). A loop that asks the device a question per element, per row or
per term is slow on a GPU and invisible on the CPU: a float64 GELU once waited on every term of
its series. These tests run a small program on the stand-in in a child process (which installs
it as ``cupy``) and check how the waits scale.
"""
import json
import os
import subprocess
import sys

from support import REPO

RUN = os.path.join(str(REPO), "tests", "strict_cupy_run.py")

PROGRAM = '''
import json
import numpy as np
import minitx
import minitx.functional as F
import strict_cupy
from minitx.models import GPT, GPTConfig
from minitx.optim import AdamW

minitx.set_backend("cupy")


def training_step(batch, length, layers):
    minitx.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=length, n_layer=layers, n_head=4, n_embd=32))
    opt = AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 65, (batch, length)), rng.integers(0, 65, (batch, length))
    with strict_cupy.counting_syncs() as waits:
        _, loss = model(minitx.tensor(x), minitx.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return sum(waits.values())


def gelu(n, dtype):
    x = minitx.tensor(np.random.default_rng(1).standard_normal(n) * 2, dtype=dtype,
                      requires_grad=True)
    with strict_cupy.counting_syncs() as waits:
        F.gelu(x).sum().backward()
    return sum(waits.values())


print("WAITS " + json.dumps({
    "step": [training_step(b, t, 2) for b, t in ((2, 8), (8, 32), (16, 64))],
    "step_layers": [training_step(4, 16, n) for n in (1, 2, 4)],
    "gelu32": [gelu(n, "float32") for n in (10, 10_000)],
    "gelu64": [gelu(n, "float64") for n in (10, 10_000)],
}))
'''


def _waits(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(PROGRAM, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("MINITX_BACKEND", "MINITX_TEST_BACKEND")}
    proc = subprocess.run([sys.executable, RUN, str(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("WAITS ")][-1]
    return json.loads(line[len("WAITS "):])


def test_waits_do_not_grow_with_the_data(tmp_path):
    """A training step waits as often for 2 × 8 tokens as for 16 × 64, and a float32 GELU
    (forward and backward) never; a float64 GELU's series checks its convergence a few times,
    however many elements. Waits may grow with the layers (each checks its own indices and
    scales), but by the same number per layer."""
    w = _waits(tmp_path)
    assert len(set(w["step"])) == 1, w["step"]
    one, two, four = w["step_layers"]
    assert two - one == (four - two) / 2, w["step_layers"]       # linear in the layers
    assert w["gelu32"] == [0, 0], w["gelu32"]
    small, large = w["gelu64"]
    assert large <= small + 2, w["gelu64"]          # the larger sample reaches larger |x|
