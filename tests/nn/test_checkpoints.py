"""Training checkpoints (``minitx.save_checkpoint`` / ``load_checkpoint``) and the atomic
writer under them (``minitx.backend.npz.write_npz``, also ``Module.save``'s).

What is shown: a run stopped at step k and resumed from its checkpoint computes the same bits as
the run never stopped (dropout included: minitx's generator comes back); a checkpoint of another
model, config, optimizer, schedule or dtype is refused naming the difference and changes
nothing; broken, hand-edited and newer files are refused; and a save interrupted at every one of
the writer's write / flush / fsync / rename boundaries, by an error or by Ctrl-C, leaves the
previous checkpoint loadable and unchanged, with no stray file.
"""
import errno
import json
import os
import zipfile

import numpy as np
import pytest

import minitx
from minitx import nn, optim
from minitx.backend import npz, read_npz, to_host
from minitx.checkpoints import (FORMAT_VERSION, CheckpointError, CheckpointMismatchError,
                                CheckpointWarning, load_checkpoint, read_header,
                                save_checkpoint)

VOCAB, BLOCK = 11, 8


def gpt(n_embd=8, dropout=0.1, seed=0):
    minitx.manual_seed(seed)
    return nn.GPT(nn.GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=1, n_head=2,
                               n_embd=n_embd, dropout=dropout))


def run(kind="adamw", n_embd=8, seed=0):
    """A fresh (model, optimizer, schedule) for one of the optimizers under test."""
    model = gpt(n_embd, seed=seed)
    if kind == "adamw":
        opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    elif kind == "adam-amsgrad":
        opt = optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    else:
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    return model, opt, optim.WarmupCosine(opt, warmup_steps=2, total_steps=12, min_lr=1e-4)


def train(model, opt, sched, gen, steps, losses):
    """``steps`` training steps on random token windows drawn from ``gen`` (dropout on)."""
    for _ in range(steps):
        x = gen.integers(0, VOCAB, (2, BLOCK + 1))
        _, loss = model(minitx.tensor(x[:, :-1]), minitx.tensor(x[:, 1:]))
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.item()))
    return losses


def snapshot(model, opt=None, sched=None):
    """Everything a refused load must leave as it was: parameters, optimizer state and lrs,
    the schedule's step, minitx's generator."""
    state = {"model": {k: v.copy() for k, v in model.state_dict().items()},
             "rng": json.dumps(minitx.backend.rng().bit_generator.state)}
    if opt is not None:
        sd = opt.state_dict()
        state["opt"] = {(i, k): np.copy(v) for i, e in sd["state"].items() for k, v in e.items()}
        state["lrs"] = [g["lr"] for g in opt.param_groups]
    if sched is not None:
        state["sched"] = sched.last_epoch
    return state


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert a[key].keys() == b[key].keys(), key
            for k in a[key]:
                np.testing.assert_array_equal(a[key][k], b[key][k], err_msg=f"{key} {k}")
        else:
            assert a[key] == b[key], key


# ---- resume, bit for bit ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["adamw", "adam-amsgrad", "sgd-nesterov"])
@pytest.mark.parametrize("stop", [1, 4])
def test_a_resumed_run_computes_the_same_bits(tmp_path, kind, stop):
    total = 7
    uninterrupted, opt, sched = run(kind)
    whole = train(uninterrupted, opt, sched, np.random.default_rng(5), total, [])

    model, opt, sched = run(kind)
    gen = np.random.default_rng(5)
    part = train(model, opt, sched, gen, stop, [])
    save_checkpoint(tmp_path / "ck", model, opt, sched, step=stop, losses=part, data=gen)

    # a new process: the same objects built again, every generator elsewhere
    model, opt, sched = run(kind, seed=99)
    np.random.seed(123)
    state = load_checkpoint(tmp_path / "ck.npz", model, opt, sched)
    assert state["step"] == stop and state["losses"] == part
    rest = train(model, opt, sched, state["data"], total - stop, state["losses"])
    assert rest == whole                                    # every loss, bit for bit
    for (k, a), b in zip(uninterrupted.state_dict().items(), model.state_dict().values()):
        np.testing.assert_array_equal(a, b, err_msg=k)     # every parameter, bit for bit


def test_dropout_after_a_resume_draws_what_it_would_have(tmp_path):
    model, opt, sched = run()
    save_checkpoint(tmp_path / "ck", model, opt, sched, step=0)
    expected = minitx.backend.rng().random(5)               # the next draws of the run
    minitx.manual_seed(1234)
    load_checkpoint(tmp_path / "ck.npz", model, opt, sched)
    np.testing.assert_array_equal(minitx.backend.rng().random(5), expected)


def test_numpy_global_generator_comes_back(tmp_path):
    model, opt, sched = run()
    np.random.seed(3)
    save_checkpoint(tmp_path / "ck", model)
    expected = np.random.random(4)
    np.random.seed(77)
    load_checkpoint(tmp_path / "ck.npz", model)
    np.testing.assert_array_equal(np.random.random(4), expected)


def test_extras_come_back_as_saved(tmp_path):
    model = gpt()
    gen = np.random.default_rng(8)
    gen.random(3)
    floats = [0.1, 1 / 3, 2.0 ** -40, float("inf")]
    save_checkpoint(tmp_path / "ck", model, step=4, floats=floats, order=np.arange(5)[::-1],
                    gen=gen, info={"name": "x", "pairs": [(1, 0.5)]}, scalar=np.float32(0.25))
    state = load_checkpoint(tmp_path / "ck.npz", model)
    assert state["floats"] == floats                          # the same bits, via JSON
    np.testing.assert_array_equal(state["order"], [4, 3, 2, 1, 0])
    assert state["gen"].random() == gen.random()              # a Generator in the same state
    assert state["info"] == {"name": "x", "pairs": [[1, 0.5]]}    # tuples come back as lists
    assert state["scalar"] == 0.25 and state["step"] == 4


def test_an_extra_that_is_no_array_nor_json_is_refused_by_name(tmp_path):
    with pytest.raises(TypeError, match="extra 'hook'"):
        save_checkpoint(tmp_path / "ck", gpt(), hook=print)
    assert not os.listdir(tmp_path)


def test_the_file_holds_plain_arrays_only(tmp_path):
    model, opt, sched = run()
    train(model, opt, sched, np.random.default_rng(0), 2, [])
    path = save_checkpoint(tmp_path / "ck", model, opt, sched, step=2, losses=[1.0])
    with np.load(path, allow_pickle=False) as f:              # refuses any pickle
        names = set(f.files)
        header = json.loads(str(f["header"][()]))
    assert {"header", "rng/minitx", "rng/numpy"} <= names
    assert {f"model/{k}" for k in model.state_dict()} <= names
    assert {"optimizer/0/exp_avg", "optimizer/0/exp_avg_sq", "optimizer/0/step"} <= names
    assert header["format_version"] == FORMAT_VERSION and header["step"] == 2
    assert header["dtype"] == "float32" and header["backend"] == minitx.get_backend()
    assert header["model"]["config"]["n_embd"] == 8
    assert header["scheduler"]["settings"] == {"min_lr": 1e-4, "total_steps": 12,
                                               "warmup_steps": 2}
    assert read_header(path) == header


def test_the_fast_switch_is_restored(tmp_path):
    model = gpt()
    before = minitx.config.fast
    try:
        with minitx.using_config(fast=False):
            save_checkpoint(tmp_path / "ck", model)
        minitx.config.fast = True
        load_checkpoint(tmp_path / "ck.npz", model)
        assert minitx.config.fast is False
        load_checkpoint(tmp_path / "ck.npz", model, restore_settings=False)
    finally:
        minitx.config.fast = before


# ---- refusals: nothing changes ----------------------------------------------------------

def refused(path, model, opt=None, sched=None, match=""):
    """Load must raise naming ``match`` and leave everything as it was."""
    before = snapshot(model, opt, sched)
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(path, model, opt, sched)
    assert_same(snapshot(model, opt, sched), before)
    return str(info.value)


@pytest.fixture
def saved(tmp_path):
    model, opt, sched = run()
    train(model, opt, sched, np.random.default_rng(0), 2, [])
    return save_checkpoint(tmp_path / "ck", model, opt, sched, step=2)


def trained(kind="adamw", n_embd=8):
    """A run two steps in, so that a refused load has state to leave alone."""
    model, opt, sched = run(kind, n_embd=n_embd, seed=1)
    train(model, opt, sched, np.random.default_rng(1), 2, [])
    return model, opt, sched


def test_another_model_config_is_refused(saved):
    msg = refused(saved, *trained(n_embd=16), match="n_embd")
    assert isinstance(CheckpointMismatchError(msg), ValueError)
    assert "checkpoint 8, here 16" in msg and "nothing was changed" in msg


def test_another_model_class_is_refused(saved):
    model = nn.Sequential(nn.Linear(2, 2))
    refused(saved, model, match="model class")


def test_another_optimizer_is_refused(saved):
    refused(saved, *trained("sgd-nesterov"), match="optimizer: checkpoint AdamW, here SGD")


def test_another_hyperparameter_is_refused(saved):
    model, opt, sched = trained()
    opt.param_groups[0]["weight_decay"] = 0.5
    refused(saved, model, opt, sched, match="weight_decay: checkpoint 0.1, here 0.5")


def test_another_schedule_is_refused(saved):
    model, opt, _ = trained()
    sched = optim.WarmupCosine(opt, warmup_steps=2, total_steps=20, min_lr=1e-4)
    refused(saved, model, opt, sched, match="total_steps: checkpoint 12, here 20")


def test_another_dtype_is_refused(saved):
    model, opt, sched = run()
    model.double()
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    sched = optim.WarmupCosine(opt, warmup_steps=2, total_steps=12, min_lr=1e-4)
    refused(saved, model, opt, sched, match="float32, here .* float64")


def test_an_optimizer_without_saved_state_is_refused(tmp_path):
    model, opt, sched = trained()
    path = save_checkpoint(tmp_path / "ck", model)             # the model only
    refused(path, model, opt, match="holds no optimizer state")
    load_checkpoint(path, model)                                # the model alone loads


@pytest.mark.parametrize("edit", ["shape", "dtype", "optimizer-shape", "stray"])
def test_a_hand_edited_checkpoint_is_refused_naming_the_entry(saved, edit):
    arrays = read_npz(saved)
    key = "model/wte.weight" if not edit.startswith("optimizer") else "optimizer/0/exp_avg"
    if edit in ("shape", "optimizer-shape"):
        arrays[key] = arrays[key][:-1]
    elif edit == "dtype":
        arrays[key] = arrays[key].astype(np.float64)
    else:
        arrays["notes"] = np.zeros(2)
    npz.write_npz(saved, arrays)
    msg = refused(saved, *trained(), match="notes" if edit == "stray" else key.split("/", 1)[1]
                  if edit in ("shape", "dtype") else key)
    if edit == "dtype":
        assert "float64" in msg


def test_a_newer_format_is_refused(saved):
    arrays = read_npz(saved)
    header = json.loads(str(arrays["header"][()]))
    header["format_version"] = FORMAT_VERSION + 1
    arrays["header"] = np.array(json.dumps(header))
    npz.write_npz(saved, arrays)
    refused(saved, *trained(), match=f"format version {FORMAT_VERSION + 1}.*upgrade minitx")


def test_a_broken_generator_state_is_refused(saved):
    arrays = read_npz(saved)
    arrays["rng/minitx"] = np.array(json.dumps({"bit_generator": "PCG64", "state": {}}))
    npz.write_npz(saved, arrays)
    refused(saved, *trained(), match="rng/minitx")


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_a_truncated_checkpoint_is_refused(saved, cut):
    data = open(saved, "rb").read()
    with open(saved, "wb") as fh:
        fh.write(data[:int(len(data) * cut)])
    refused(saved, *trained(), match="truncated or corrupt")


def test_a_module_save_file_is_not_a_training_checkpoint(tmp_path):
    model = gpt()
    path = model.save(tmp_path / "weights")
    refused(path, model, match="not a training checkpoint.*model.load")


def test_nan_in_the_state_is_saved_with_a_warning_naming_the_entry(tmp_path):
    model = nn.Linear(3, 2)
    weight = to_host(model.weight).copy()
    weight[0, 1] = np.nan
    model.weight.copy_(weight)
    with pytest.warns(CheckpointWarning, match="'model/weight' holds 1 NaN"):
        path = save_checkpoint(tmp_path / "ck", model)
    assert np.isnan(read_npz(path)["model/weight"][0, 1])       # saved as it was
    with pytest.warns(CheckpointWarning, match="'model/weight' holds 1 NaN"):
        load_checkpoint(path, model)


# ---- the atomic writer ------------------------------------------------------------------

class Faults:
    """Counts the writer's boundaries (every write and flush of its file, every fsync, the
    rename) and raises at the ``at``-th: an OSError (disk full) or a KeyboardInterrupt."""

    def __init__(self, monkeypatch, at=None, error=None):
        self.at, self.error, self.ops = at, error, []
        real_open, real_fsync, real_replace = open, os.fsync, os.replace

        def tick(name):
            self.ops.append(name)
            if len(self.ops) == self.at:
                raise self.error

        def fake_open(path, mode="r", *args, **kw):
            return FaultyFile(real_open(path, mode, *args, **kw), tick)

        monkeypatch.setattr(npz, "open", fake_open, raising=False)
        monkeypatch.setattr(os, "fsync", lambda fd: (tick("fsync"), real_fsync(fd))[1])
        monkeypatch.setattr(os, "replace", lambda a, b: (tick("replace"), real_replace(a, b))[1])


class FaultyFile:
    """A binary file whose ``write`` and ``flush`` go through ``tick`` first."""

    def __init__(self, fh, tick):
        self._fh, self._tick = fh, tick

    def write(self, data):
        self._tick("write")
        return self._fh.write(data)

    def flush(self):
        self._tick("flush")
        return self._fh.flush()

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def test_a_save_interrupted_at_every_boundary_keeps_the_previous_checkpoint(tmp_path,
                                                                           monkeypatch):
    model = nn.Linear(3, 2)
    opt = optim.AdamW(model.parameters(), lr=0.1)
    sched = optim.WarmupCosine(opt, warmup_steps=1, total_steps=5)

    def step():
        out = model(minitx.tensor(np.ones((1, 3), "float32"))).sum()
        opt.zero_grad()
        out.backward()
        opt.step()
        sched.step()

    step()
    path = save_checkpoint(tmp_path / "ck", model, opt, sched, step=1)
    old = read_npz(path)
    step()
    with monkeypatch.context() as m:                      # a clean save, counting boundaries
        count = Faults(m)
        save_checkpoint(tmp_path / "probe", model, opt, sched, step=2)
    ops = count.ops
    renamed = ops.index("replace")
    assert ops.count("write") > 3 and ops[renamed - 2:renamed] == ["flush", "fsync"]
    new = read_npz(tmp_path / "probe.npz")
    os.remove(tmp_path / "probe.npz")
    for at in range(1, len(ops) + 1):
        error = KeyboardInterrupt() if at % 2 else OSError(errno.ENOSPC, "No space left")
        with monkeypatch.context() as m:
            Faults(m, at, error)
            try:
                save_checkpoint(path, model, opt, sched, step=2)
            except (OSError, KeyboardInterrupt) as exc:
                assert at <= renamed + 1 or isinstance(exc, KeyboardInterrupt), (at, ops)
                if isinstance(exc, OSError):
                    assert path in str(exc) and "unchanged" in str(exc)
        expected = old if at <= renamed + 1 else new      # the rename is boundary renamed + 1
        got = read_npz(path)
        assert got.keys() == expected.keys(), (at, ops[at - 1])
        for key in got:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{at}: {key}")
        assert sorted(os.listdir(tmp_path)) == ["ck.npz"], (at, ops[at - 1])   # no stray file
        npz.write_npz(path, old)                          # the old one back for the next try


def test_module_save_is_atomic_too(tmp_path, monkeypatch):
    model = nn.Linear(3, 2)
    path = model.save(tmp_path / "w.npz")
    assert path == str(tmp_path / "w.npz")                # no second suffix
    before = read_npz(path)
    model.weight.copy_(np.zeros((2, 3), "float32"))
    with monkeypatch.context() as m:
        Faults(m, at=2, error=KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            model.save(path)
    np.testing.assert_array_equal(read_npz(path)["weight"], before["weight"])
    assert os.listdir(tmp_path) == ["w.npz"]


def test_a_stray_temporary_from_a_kill_is_replaced_by_the_next_save(tmp_path):
    model = gpt()
    stray = tmp_path / "ck.npz.tmp"
    stray.write_bytes(b"PK\x03\x04 half of an archive")       # what a kill mid-save leaves
    path = save_checkpoint(tmp_path / "ck", model)
    assert os.listdir(tmp_path) == ["ck.npz"]
    load_checkpoint(path, model)


def test_a_disk_full_mid_write_keeps_the_previous_checkpoint(saved, monkeypatch):
    before = open(saved, "rb").read()
    with monkeypatch.context() as m:
        Faults(m, at=5, error=OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(OSError, match="No space left on device") as info:
            save_checkpoint(saved, *trained(), step=3)
    assert info.value.errno == errno.ENOSPC and saved in str(info.value)
    assert open(saved, "rb").read() == before
    assert os.listdir(os.path.dirname(saved)) == ["ck.npz"]


def test_a_read_only_folder_is_refused_naming_the_file(tmp_path, monkeypatch):
    model = gpt()
    # what the kernel answers a user without write permission (root would be let through a
    # chmod, so the answer is given here; the real chmod follows where it binds)
    with monkeypatch.context() as m:
        m.setattr(npz, "open", lambda *a, **k: (_ for _ in ()).throw(
            PermissionError(errno.EACCES, "Permission denied")), raising=False)
        with pytest.raises(PermissionError, match="ck.npz"):
            save_checkpoint(tmp_path / "ck", model)
    assert not os.listdir(tmp_path)
    if os.geteuid() != 0:
        os.chmod(tmp_path, 0o500)
        try:
            with pytest.raises(PermissionError, match="ck.npz"):
                save_checkpoint(tmp_path / "ck", model)
        finally:
            os.chmod(tmp_path, 0o700)


def test_a_folder_as_the_path_is_refused(tmp_path):
    (tmp_path / "ck.npz").mkdir()
    with pytest.raises(IsADirectoryError, match="folder"):
        save_checkpoint(tmp_path / "ck.npz", gpt())
    with pytest.raises(IsADirectoryError, match="folder"):
        load_checkpoint(tmp_path / "ck.npz", gpt())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_checkpoint(tmp_path / "nowhere" / "ck", gpt())


def test_the_writer_refuses_object_arrays_before_touching_the_file(tmp_path):
    path = npz.write_npz(tmp_path / "a.npz", {"x": np.arange(3)})
    with pytest.raises(TypeError, match="'y' holds Python objects"):
        npz.write_npz(path, {"y": np.array([{}, 1], dtype=object)})
    np.testing.assert_array_equal(read_npz(path)["x"], np.arange(3))
    with zipfile.ZipFile(path) as zf:
        assert zf.namelist() == ["x.npy"]
