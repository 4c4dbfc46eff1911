r"""Saved-array versions: a backward whose saved input was changed in place raises.

A Function saves arrays for its backward (``ctx.save_for_backward``). If one of them is
changed in place between the forward and the backward, the backward would compute with the
new values and return a wrong gradient, silently::

    y = x * w            # Mul saves x and w
    w.copy_(w2)          # w changed in place
    y.sum().backward()   # x.grad would be w2, not w

minitx raises instead, naming the op (PyTorch's rule). How it knows, at no cost to an op
that nothing touches:

- every in-place write made *through minitx* — ``Tensor.copy_``, ``fill_``, ``zero_``, the
  in-place arithmetic (``add_``, ``sub_``, ``mul_``, ``div_``), an optimizer's ``step``,
  ``load_state_dict``, the ``nn.init`` functions — calls :func:`mark_written` on the array,
  which stamps the array's memory (its NumPy ``base``, so a write through a view counts for
  every view of that memory) with a new value of one global write counter;
- the forward records the counter's value in the graph node (``ctx.stamp``);
- at backward, if the counter has not moved since the forward (the common case: one integer
  comparison), nothing was written; otherwise each saved array's memory is looked up, and
  one written after the forward raises :class:`SavedArrayModified`.

Writing to ``tensor.data`` directly (``t.data[...] = 0``, ``t.data -= 1``) bypasses this, as
in PyTorch: ``.data`` is the raw array, outside autograd's view.
"""
from __future__ import annotations

import weakref

__all__ = ["mark_written", "written_after", "SavedArrayModified", "state"]

state = {"stamp": 0}       # how many in-place writes minitx has seen: the global counter
_written = {}              # id(memory) -> (weak reference to it or None, stamp of last write)
_prune_at = [1024]         # drop the entries of freed memory when the table reaches this size


class SavedArrayModified(RuntimeError):
    """An array saved for a backward was changed in place after the forward that saved it."""


def _memory(array):
    """The object that owns ``array``'s memory: its ``base`` (NumPy and CuPy keep the owner
    there, for a view of a view too), or the array itself."""
    base = getattr(array, "base", None)
    return array if base is None else base


def mark_written(array) -> None:
    """Record that ``array``'s memory was changed in place (called by every in-place op)."""
    state["stamp"] += 1
    memory = _memory(array)
    try:
        ref = weakref.ref(memory)
    except TypeError:              # an owner that takes no weak reference: the stamp alone
        ref = None                 # is still right (see written_after)
    _written[id(memory)] = (ref, state["stamp"])
    if len(_written) >= _prune_at[0]:
        for key in [k for k, (r, _) in _written.items() if r is not None and r() is None]:
            del _written[key]
        _prune_at[0] = max(1024, 2 * len(_written))


def written_after(array, stamp: int) -> bool:
    """Whether ``array``'s memory was written in place after the counter read ``stamp``.

    An entry left by freed memory whose id was reused cannot fool this: that write happened
    before the new memory existed, so before any forward that saved it, i.e. at a stamp
    ≤ ``stamp``."""
    entry = _written.get(id(_memory(array)))
    return entry is not None and entry[1] > stamp
