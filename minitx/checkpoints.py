"""Training checkpoints: stop a run at any step and resume it, bit for bit.

    minitx.save_checkpoint("out/checkpoint.npz", model, opt, sched, step=step,
                           losses=losses, data_rng=gen)
    ...                                             # killed; a new process builds the same
    state = minitx.load_checkpoint("out/checkpoint.npz", model, opt, sched)   # objects, then
    step, losses, gen = state["step"], state["losses"], state["data_rng"]     # carries on

A resumed run computes exactly what the uninterrupted run would have only if *everything* its
next step reads is as it was: the parameters, the optimizer's moments and step counts, the
schedule's position, and every random state it draws from (minitx's generator for dropout and
random features, the data pipeline's generator, the data order). All of it goes into one
``.npz`` (plain arrays, never a pickle), written atomically by ``backend.npz.write_npz`` — a kill
during a save leaves the previous checkpoint.

File layout (the entries of the ``.npz``)::

    header                   JSON text (a 0-d str array), below
    model/<key>              every entry of model.state_dict() (parameters, persistent buffers)
    optimizer/<i>/<name>     optimizer.state_dict()["state"]: parameter i's (its position across
                             the param groups) exp_avg, exp_avg_sq, momentum_buffer, ... and its
                             step count (a 0-d int64)
    rng/minitx               manual_seed's generator: numpy's bit_generator.state, as JSON text
    rng/numpy                NumPy's global generator (np.random.seed's), the same way
    extra/<name>             an array, or a numpy Generator's state (JSON text), passed as extra

    header = {"format": "minitx.checkpoint", "format_version": 1, "minitx_version": "0.1.0",
              "backend": "numpy", "dtype": "float32", "fast": true, "threads": 2,
              "step": 120,
              "model": {"class": "minitx.models.gpt.GPT", "config": {...} or null},
              "optimizer": {"class": "AdamW", "param_groups": [{"lr": ..., "betas": [...],
                            ..., "params": [0, 1, ...]}], "python_scalars": ["0/step", ...]},
              "scheduler": {"class": "WarmupCosine", "settings": {"warmup_steps": 5, ...},
                            "state": {"last_epoch": 120, "base_lrs": [...]}},
              "extra": {"losses": [...], "order": {"array": "extra/order"},
                        "data_rng": {"generator": "extra/data_rng"}}}

Floats in the header are written by ``json`` as Python's shortest repr, which reads back to the
same bits. ``fast`` (``minitx.config.fast``) and ``threads`` (``fast.parallel.thread_count()``)
are recorded because results depend on them: a fast twin may round differently from its
reference, and the threaded attention splits its rows into ``thread_count()`` blocks, whose
key gradients it sums in that order. ``load_checkpoint`` restores both.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings

import numpy

from . import __version__, backend, configuration
from .backend.npz import CheckpointError, read_npz, write_npz
from .fast.parallel import thread_count

__all__ = ["FORMAT", "FORMAT_VERSION", "CheckpointMismatchError", "CheckpointWarning",
           "load_checkpoint", "read_header", "save_checkpoint"]

FORMAT = "minitx.checkpoint"
FORMAT_VERSION = 1


class CheckpointMismatchError(CheckpointError):
    """A checkpoint of another model, config, optimizer, schedule or dtype: the message lists
    every difference; nothing was changed."""


class CheckpointWarning(RuntimeWarning):
    """A checkpoint saved or loaded with NaN or infinite values (the entry is named)."""


# ---- small encoders: Python values <-> plain arrays and JSON -----------------------------

def _json_array(value) -> numpy.ndarray:
    """JSON text as a 0-d str array (a plain array: ``read_npz`` reads it, nothing unpickles)."""
    return numpy.array(json.dumps(value, sort_keys=True))


def _from_json_array(array, path: str, key: str):
    try:
        return json.loads(str(array[()]))
    except (ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(f"checkpoint {path!r}: entry {key!r} is not JSON text ({exc})") \
            from exc


def _rng_state(generator) -> dict:
    """A bit generator's state (``bit_generator.state``) with its arrays as tagged lists, so it
    is JSON (PCG64's 128-bit integers stay exact: JSON integers have no size limit)."""
    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, numpy.ndarray):
            return {"ndarray": v.tolist(), "dtype": str(v.dtype)}
        return v.item() if isinstance(v, numpy.generic) else v
    return plain(generator.bit_generator.state if hasattr(generator, "bit_generator")
                 else generator)


def _rng_state_back(state) -> dict:
    """``_rng_state``'s inverse: the dict ``bit_generator.state = ...`` takes."""
    if isinstance(state, dict) and set(state) == {"ndarray", "dtype"}:
        return numpy.array(state["ndarray"], dtype=state["dtype"])
    if isinstance(state, dict):
        return {k: _rng_state_back(v) for k, v in state.items()}
    return state


def _new_generator(state: dict, where: str) -> numpy.random.Generator:
    """A ``numpy.random.Generator`` in ``state`` (its bit generator named by the state)."""
    kind = getattr(numpy.random, str(state.get("bit_generator")), None)
    if not (isinstance(kind, type) and issubclass(kind, numpy.random.BitGenerator)):
        raise CheckpointError(f"{where}: unknown bit generator {state.get('bit_generator')!r}")
    bits = kind()
    bits.state = _rng_state_back(state)
    return numpy.random.Generator(bits)


def _jsonable(value, what: str):
    """``value`` as JSON (NumPy scalars as Python numbers, tuples as lists), or a TypeError
    naming ``what``."""
    try:
        return json.loads(json.dumps(value, default=lambda v: v.item()
                                     if isinstance(v, numpy.generic) else _refuse(v)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"save_checkpoint: {what} must be an array, a numpy Generator or "
                        f"JSON-like (numbers, strings, lists, dicts), got {value!r} ({exc})") \
            from None


def _refuse(value):
    raise TypeError(f"{type(value).__name__} is not JSON")


def _model_config(model):
    """The model's config as JSON (``model.config`` when it is a dataclass or a dict), or None.
    Values JSON cannot hold are written as their repr (compared as text)."""
    config = getattr(model, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, dict):
        return None
    return json.loads(json.dumps(config, sort_keys=True, default=repr))


def _class_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _dtype_name(model) -> str:
    """The dtype(s) of the model's floating parameters: "float32", or "float16,float32"."""
    kinds = sorted({str(p.dtype) for p in model.parameters() if p.dtype.kind == "f"})
    return ",".join(kinds) or "none"


def _scheduler_settings(scheduler) -> dict:
    """A schedule's own numbers (warmup_steps, total_steps, min_lr, ...): what makes two
    schedules the same schedule. Its position (``last_epoch``) is its state, not a setting."""
    return {k: v for k, v in sorted(vars(scheduler).items())
            if not k.startswith("_") and k not in ("last_epoch", "base_lrs", "optimizer")
            and isinstance(v, (bool, int, float, str))}


# ---- saving --------------------------------------------------------------------------------

def save_checkpoint(path, model, optimizer=None, scheduler=None, step=None, **extra) -> str:
    """Write everything a run needs to resume bit for bit into one ``.npz`` at ``path``
    (".npz" appended when missing; the layout is in the module docstring); returns the path.

    ``model``: a ``minitx.nn.Module``; ``optimizer``, ``scheduler``: a ``minitx.optim``
    optimizer and schedule (optional); ``step``: the number of steps done (an int, optional).
    ``extra``: anything else the run needs back, each an array, a ``numpy.random.Generator``
    (its state is saved; ``load_checkpoint`` returns a Generator in that state) or JSON-like
    values (numbers, strings, lists, dicts; floats come back with the same bits, tuples as
    lists). minitx's generator (``manual_seed``'s) and NumPy's global one are always saved.

    The write is atomic (``backend.npz.write_npz``): a failure, a Ctrl-C or a kill leaves the
    previous checkpoint as it was. NaN or infinite values are saved, with a
    ``CheckpointWarning`` naming each entry that holds them.
    """
    path = _npz_path(path)
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, numpy.integer))
                             or step < 0):
        raise TypeError(f"save_checkpoint: step must be None or an int >= 0, got {step!r}")
    arrays = {f"model/{key}": array for key, array in model.state_dict().items()}
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "minitx_version": __version__,
              "backend": backend.get_backend(), "dtype": _dtype_name(model),
              "fast": bool(configuration.config.fast), "threads": thread_count(),
              "step": None if step is None else int(step),
              "model": {"class": _class_name(model), "config": _model_config(model)},
              "optimizer": None if optimizer is None else _encode_optimizer(optimizer, arrays),
              "scheduler": None if scheduler is None else {
                  "class": type(scheduler).__name__,
                  "settings": _scheduler_settings(scheduler),
                  "state": _jsonable(scheduler.state_dict(), "the scheduler's state")},
              "extra": {name: _encode_extra(name, value, arrays) for name, value in extra.items()}}
    # every random state the run may draw from: minitx's (dropout, random features, sampling)
    # and NumPy's global one; a data pipeline's own Generator comes as an extra
    arrays["rng/minitx"] = _json_array(_rng_state(backend.rng()))
    arrays["rng/numpy"] = _json_array(_rng_state(numpy.random.get_state(legacy=False)))
    arrays["header"] = _json_array(header)
    _warn_non_finite(path, arrays, "saved")
    return write_npz(path, arrays)


def _npz_path(path) -> str:
    path = os.fspath(path)
    return path if path.endswith(".npz") else path + ".npz"


def _encode_optimizer(optimizer, arrays: dict) -> dict:
    """``optimizer.state_dict()``: its arrays as ``optimizer/<i>/<name>`` entries, Python
    numbers (the step counts) as 0-d arrays listed in ``python_scalars`` (read back as Python
    numbers: a NumPy step count would change Adam's bias correction's type), and the param
    groups' hyperparameters as JSON."""
    state = optimizer.state_dict()
    scalars = []
    for index, entry in state["state"].items():
        for name, value in entry.items():
            key = f"{index}/{name}"
            if isinstance(value, (bool, int, float)):
                scalars.append(key)
            elif not isinstance(value, numpy.ndarray):
                raise TypeError(f"save_checkpoint: optimizer state {key!r} is a "
                                f"{type(value).__name__}, not an array or a number")
            arrays[f"optimizer/{key}"] = numpy.asarray(value)
    groups = [_jsonable(group, f"the hyperparameters of param group {i}")
              for i, group in enumerate(state["param_groups"])]
    return {"class": type(optimizer).__name__, "param_groups": groups, "python_scalars": scalars}


def _encode_extra(name: str, value, arrays: dict) -> dict:
    """One extra, tagged by how it is stored: {"array": entry}, {"generator": entry} (its
    state as JSON text) or {"json": value}."""
    if isinstance(value, numpy.random.Generator):
        arrays[f"extra/{name}"] = _json_array(_rng_state(value))
        return {"generator": f"extra/{name}"}
    if isinstance(value, numpy.ndarray) or hasattr(value, "__array_namespace__"):
        arrays[f"extra/{name}"] = backend.to_host(value)
        return {"array": f"extra/{name}"}
    return {"json": _jsonable(value, f"extra {name!r}")}


def _warn_non_finite(path: str, arrays: dict, done: str) -> None:
    """A ``CheckpointWarning`` for each floating entry holding NaN or an infinity."""
    for key, array in arrays.items():
        if array.dtype.kind in "fc" and array.size and not numpy.isfinite(array).all():
            nan = int(numpy.isnan(array).sum())
            inf = int(numpy.isinf(array).sum())
            warnings.warn(f"checkpoint {path!r} {done} with non-finite values: entry {key!r} "
                          f"holds {nan} NaN and {inf} infinite of {array.size} values (the run "
                          "had diverged before this save)", CheckpointWarning, stacklevel=3)


# ---- loading -------------------------------------------------------------------------------

def load_checkpoint(path, model, optimizer=None, scheduler=None, *,
                    restore_settings: bool = True) -> dict:
    """Resume from ``save_checkpoint``'s file: load the model, the optimizer and the schedule
    in place, restore minitx's generator (``manual_seed``'s: dropout after the resume draws
    what it would have) and NumPy's global one; returns ``{"step": step, **extra}`` (a saved
    Generator comes back as a Generator in its saved state).

    With ``restore_settings`` the settings results depend on come back as saved:
    ``minitx.config.fast`` and, when it differs, the thread count (``MINITX_THREADS``).

    Everything is checked before anything changes: a checkpoint of another model class,
    model config, parameter name, shape or dtype, of another optimizer or hyperparameter
    (the learning rate aside: the schedule sets it), another schedule, or no optimizer state
    when an optimizer is given, raises ``CheckpointMismatchError`` listing every difference; a
    truncated, corrupt or hand-broken file, or one of a newer format, ``CheckpointError``.
    Either way the model, optimizer, schedule and generators are left as they were.
    """
    path = _npz_path(path)
    arrays = read_npz(path)                    # refuses a truncated or corrupt file
    header = _read_header(path, arrays)
    problems = _model_problems(header, arrays, model)
    opt_state = _optimizer_state(header, arrays, optimizer, problems)
    sched_state = _scheduler_state(header, scheduler, problems)
    strays = [k for k in arrays if k != "header" and
              not k.startswith(("model/", "optimizer/", "rng/", "extra/"))]
    if strays:
        problems.append(f"entries no checkpoint has: {', '.join(sorted(strays))}")
    if problems:
        raise CheckpointMismatchError(f"checkpoint {path!r} does not fit (nothing was "
                                      "changed):\n  " + "\n  ".join(problems))
    rngs = _random_states(path, arrays)
    extra = _decode_extras(path, header, arrays)
    _warn_non_finite(path, arrays, "loaded")
    # -- everything checked: from here on the loads cannot be refused --
    if optimizer is not None:
        optimizer.load_state_dict(opt_state)
    model.load_state_dict({k[len("model/"):]: a for k, a in arrays.items()
                           if k.startswith("model/")})
    if scheduler is not None:
        scheduler.load_state_dict(sched_state)
    backend.rng().bit_generator.state = rngs["minitx"]
    numpy.random.set_state(rngs["numpy"])
    if restore_settings:
        configuration.config.fast = bool(header["fast"])
        if header.get("threads") and header["threads"] != thread_count():
            os.environ["MINITX_THREADS"] = str(int(header["threads"]))
    return {"step": header["step"], **extra}


def read_header(path) -> dict:
    """The header of the checkpoint at ``path`` (module docstring), checked as
    ``load_checkpoint`` checks it, without loading anything: what a program looks at before
    it resumes (the step, the extras saved as JSON under ``header["extra"][name]["json"]``)."""
    path = _npz_path(path)
    return _read_header(path, read_npz(path))


def _read_header(path: str, arrays: dict) -> dict:
    """The header, after checking this is a minitx training checkpoint this version reads."""
    if "header" not in arrays:
        raise CheckpointError(f"checkpoint {path!r} is not a training checkpoint (no 'header' "
                              "entry); a file written by Module.save loads with model.load")
    header = _from_json_array(arrays["header"], path, "header")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path!r}: its header does not name the format "
                              f"{FORMAT!r}")
    version = header.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise CheckpointError(f"checkpoint {path!r}: format_version must be an int, got "
                              f"{version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format version {version} (written by "
                              f"minitx {header.get('minitx_version')}); this minitx "
                              f"({__version__}) reads format versions up to {FORMAT_VERSION}: "
                              "upgrade minitx to load it")
    missing = [k for k in ("step", "fast", "model", "optimizer", "scheduler", "extra")
               if k not in header]
    if missing:
        raise CheckpointError(f"checkpoint {path!r}: its header lacks {', '.join(missing)}")
    step = header["step"]
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise CheckpointError(f"checkpoint {path!r}: step must be an int >= 0 or null, got "
                              f"{step!r}")
    return header


def _random_states(path: str, arrays: dict) -> dict:
    """{"minitx": state, "numpy": state} from the ``rng/`` entries, each tried on a fresh bit
    generator of its kind first (a hand-edited state is refused here, not half-restored)."""
    states = {}
    for name, like in (("minitx", backend.rng().bit_generator), ("numpy", None)):
        key = f"rng/{name}"
        if key not in arrays:
            raise CheckpointError(f"checkpoint {path!r} lacks the entry {key!r}")
        state = _from_json_array(arrays[key], path, key)
        kind = state.get("bit_generator") if isinstance(state, dict) else None
        if like is not None and kind != type(like).__name__:
            raise CheckpointError(f"checkpoint {path!r}: entry {key!r} holds a {kind!r} state, "
                                  f"minitx's generator is a {type(like).__name__}")
        try:
            _new_generator(state, f"checkpoint {path!r}: entry {key!r}")
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint {path!r}: entry {key!r} is not a generator "
                                  f"state ({exc})") from exc
        states[name] = _rng_state_back(state)
    return states


def _differences(what: str, saved: dict, here: dict) -> list:
    """"<what> <key>: checkpoint <a>, here <b>" for each key whose values differ."""
    return [f"{what} {key}: checkpoint {saved.get(key, '(none)')!r}, here "
            f"{here.get(key, '(none)')!r}" for key in sorted(set(saved) | set(here))
            if saved.get(key, "(none)") != here.get(key, "(none)")]


def _model_problems(header: dict, arrays: dict, model) -> list:
    """What differs between the checkpoint's model and ``model``: class, config, the entries'
    names, shapes and dtypes."""
    saved = header["model"] or {}
    problems = _differences("model", {"class": saved.get("class")},
                            {"class": _class_name(model)})
    problems += _differences("model config", saved.get("config") or {},
                             _model_config(model) or {})
    entries = model.state_dict()
    stored = {k[len("model/"):]: a for k, a in arrays.items() if k.startswith("model/")}
    missing = [k for k in entries if k not in stored]
    unexpected = [k for k in stored if k not in entries]
    if missing:
        problems.append("model entries missing from the checkpoint: " + ", ".join(missing))
    if unexpected:
        problems.append("model entries this model lacks: " + ", ".join(unexpected))
    for key in entries.keys() & stored.keys():
        a, b = stored[key], entries[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"model entry {key!r}: checkpoint {a.shape} {a.dtype}, here "
                            f"{b.shape} {b.dtype}")
    return problems


def _optimizer_state(header: dict, arrays: dict, optimizer, problems: list):
    """The ``state_dict`` to give ``optimizer.load_state_dict``, after appending to
    ``problems`` whatever differs: class, group sizes, hyperparameters (not ``lr``: the
    schedule sets it), each state array's shape and dtype against its parameter."""
    saved = header["optimizer"]
    if optimizer is None:
        return None
    if saved is None:
        problems.append("an optimizer was given, but the checkpoint holds no optimizer state")
        return None
    if saved.get("class") != type(optimizer).__name__:
        problems.append(f"optimizer: checkpoint {saved.get('class')}, here "
                        f"{type(optimizer).__name__}")
        return None
    groups, here = saved["param_groups"], optimizer.param_groups
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in here]:
        problems.append(f"optimizer param group sizes: checkpoint "
                        f"{[len(g['params']) for g in groups]}, here "
                        f"{[len(g['params']) for g in here]}")
        return None
    params = {}
    for i, (s, g) in enumerate(zip(groups, here)):
        mine = _jsonable({k: v for k, v in g.items() if k not in ("lr", "params")}, "")
        problems += _differences(f"optimizer param group {i}",
                                 {k: v for k, v in s.items() if k not in ("lr", "params")}, mine)
        params.update(zip(s["params"], g["params"]))
    state = _optimizer_entries(arrays, saved.get("python_scalars", []), params, problems)
    # the saved hyperparameters, tuples where this optimizer has tuples (betas)
    groups = [{k: tuple(v) if isinstance(g.get(k), tuple) else v for k, v in s.items()}
              for s, g in zip(groups, here)]
    if not problems:
        for s, g in zip(groups, here):
            try:
                optimizer._validate({**g, **{k: v for k, v in s.items() if k != "params"}})
            except ValueError as exc:
                problems.append(f"optimizer hyperparameters: {exc}")
    return {"state": state, "param_groups": groups}


def _optimizer_entries(arrays: dict, scalars: list, params: dict, problems: list) -> dict:
    """{parameter index: {name: value}} from the ``optimizer/<i>/<name>`` entries: Python
    numbers where they were saved as such, arrays checked against their parameter."""
    state = {}
    for key, array in arrays.items():
        if not key.startswith("optimizer/"):
            continue
        index, _, name = key[len("optimizer/"):].partition("/")
        p = params.get(int(index)) if index.isdigit() else None
        if p is None or not name:
            problems.append(f"optimizer entry {key!r} names no parameter of this optimizer")
            continue
        if f"{index}/{name}" in scalars:
            state.setdefault(int(index), {})[name] = array.item()
            continue
        if tuple(array.shape) != tuple(p.shape) or array.dtype != p.dtype:
            problems.append(f"optimizer entry {key!r}: checkpoint {array.shape} {array.dtype}, "
                            f"its parameter {tuple(p.shape)} {p.dtype}")
        state.setdefault(int(index), {})[name] = array
    return state


def _scheduler_state(header: dict, scheduler, problems: list):
    """The schedule's saved state, after appending to ``problems`` a different class, setting
    or base learning rate."""
    saved = header["scheduler"]
    if scheduler is None:
        return None
    if saved is None:
        problems.append("a scheduler was given, but the checkpoint holds no scheduler state")
        return None
    problems += _differences("scheduler", {"class": saved.get("class")},
                             {"class": type(scheduler).__name__})
    problems += _differences("scheduler", saved.get("settings", {}),
                             _jsonable(_scheduler_settings(scheduler), ""))
    state = saved.get("state") or {}
    if state.get("base_lrs") != _jsonable(list(scheduler.base_lrs), ""):
        problems.append(f"scheduler base_lrs: checkpoint {state.get('base_lrs')}, here "
                        f"{list(scheduler.base_lrs)}")
    return state


def _decode_extras(path: str, header: dict, arrays: dict) -> dict:
    """The extras saved by ``save_checkpoint``: arrays, Generators and JSON values."""
    extra = {}
    for name, tagged in header["extra"].items():
        kind, value = next(iter(tagged.items())) if isinstance(tagged, dict) and \
            len(tagged) == 1 else (None, None)
        if kind == "json":
            extra[name] = value
        elif kind in ("array", "generator") and value in arrays:
            extra[name] = (arrays[value] if kind == "array" else
                           _new_generator(_from_json_array(arrays[value], path, value),
                                          f"checkpoint {path!r}: entry {value!r}"))
        else:
            raise CheckpointError(f"checkpoint {path!r}: extra {name!r} is {tagged!r}, not an "
                                  "array, a generator or a JSON value this file holds")
    return extra
