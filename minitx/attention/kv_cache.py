"""Key/value caches for incremental (token-by-token) decoding.

A causal decoder recomputes nothing about the past: at step t the new token's query attends
to the keys/values of tokens 0 … t, and those of 0 … t − 1 were already computed. A cache
keeps them, so each step costs O(t·D) per head instead of re-running the whole prefix,
O(t²·D). With Nq new queries and Nk cached keys the causal mask is bottom-right aligned
(query i sits at position Nk − Nq + i), which is what ``scaled_dot_product_attention`` does.

- ``KVCache``: one contiguous buffer per layer, (B, Hkv, capacity, D), grown by doubling.
- ``WindowKVCache``: for sliding-window layers (Mistral, Gemma's local layers): a query at
  position p sees only keys p − W + 1 … p, so the cache keeps the last W − 1 tokens and its
  memory is bounded by the window, however long the text grows.
- ``PagedKVCache``: vLLM's idea (Kwon et al. 2023, "PagedAttention"): memory is a pool of
  fixed-size pages (num_pages, page_size, Hkv, D); each sequence owns a *block table* (the list
  of its pages), pages come from a free list and go back when the sequence is freed, so
  sequences of different lengths share one pool without fragmentation. Attention gathers a
  sequence's pages into a contiguous (Hkv, L, D) view.

Caches hold raw arrays: they are for inference (gradients do not flow through them).
"""
from __future__ import annotations

from .. import validate
from ..autograd.tensor import Tensor
from ..backend import device_of, get_array_module, to_device_of, xp as active_xp

__all__ = ["KVCache", "WindowKVCache", "ChunkKVCache", "PagedKVCache", "PagedCacheView",
           "cached_length"]


def _raw(x):
    return x.data if isinstance(x, Tensor) else x


def cached_length(kv_caches, num_layers: int, *, owner: str) -> int:
    """How many tokens the per-layer caches ``kv_caches`` hold (0 when it is None): the
    position the next token takes.

    A model with ``num_layers`` layers needs one cache per layer, all holding the same
    tokens; anything else raises a ``ValueError`` naming ``owner``, the expected and the
    given count (a short list would otherwise surface as a bare ``IndexError`` in layer i).
    """
    if kv_caches is None:
        return 0
    if not isinstance(kv_caches, (list, tuple)):
        raise validate.OptionError(f"{owner}: kv_caches must be a list of one cache per layer "
                                   f"({num_layers}), got a {type(kv_caches).__name__}")
    if len(kv_caches) != num_layers:
        raise validate.OptionError(f"{owner}: kv_caches must hold one cache per layer: "
                                   f"{num_layers} caches, got {len(kv_caches)}")
    lengths = {len(c) for c in kv_caches}
    if len(lengths) > 1:
        raise validate.OptionError(f"{owner}: kv_caches must all hold the same tokens, got "
                                   f"lengths {[len(c) for c in kv_caches]}")
    return lengths.pop() if lengths else 0


class KVCache:
    """A growing contiguous cache of keys and values for one attention layer.

    ``append(k, v)`` with k (B, Hkv, n, D), v (B, Hkv, n, Dv) stores them after what is already
    cached and returns the full ``(k, v)`` Tensors (B, Hkv, length, D). ``positions`` are the
    positions of the last appended tokens. Amortised O(n·D) per append (capacity doubles).
    """

    def __init__(self, max_len: int = None):
        self.max_len = None if max_len is None else \
            validate.positive_int(max_len, "max_len", owner="KVCache")
        self.reset()

    def reset(self) -> None:
        """Forget everything cached."""
        self._k = self._v = None
        self.length = 0
        self.offset = 0          # position of the first token of the last append

    def __len__(self) -> int:
        return self.length

    @property
    def positions(self):
        """Positions of the tokens added by the last ``append``: offset … length − 1."""
        xp = get_array_module(self._k) if self._k is not None else active_xp()
        return xp.arange(self.offset, self.length)

    @property
    def keys(self):
        """The cached keys (B, Hkv, length, D) as a Tensor (None when empty)."""
        return None if self._k is None else Tensor._wrap(self._k[:, :, : self.length])

    @property
    def values(self):
        """The cached values (B, Hkv, length, Dv) as a Tensor (None when empty)."""
        return None if self._v is None else Tensor._wrap(self._v[:, :, : self.length])

    def _grow(self, k, v, needed):
        xp = get_array_module(k)
        cap = max(needed, 16 if self._k is None else 2 * self._k.shape[2])
        if self.max_len is not None:
            cap = min(cap, self.max_len)
        b, h, _, d = k.shape
        new_k = xp.empty((b, h, cap, d), dtype=k.dtype)
        new_v = xp.empty((b, h, cap, v.shape[3]), dtype=v.dtype)
        if self._k is not None:
            new_k[:, :, : self.length] = self._k[:, :, : self.length]
            new_v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = new_k, new_v

    def append(self, k, v):
        """Add k (B, Hkv, n, D), v (B, Hkv, n, Dv); return all cached (k, v) as Tensors.

        The cache lives where its first keys did; host arrays given later are copied to it
        (once, here); device arrays given to a host cache are refused."""
        k, v = _raw(k), _raw(v)
        if self._k is not None:
            k, v = to_device_of(k, self._k), to_device_of(v, self._k)
            if device_of(k) != device_of(self._k):
                raise ValueError(f"KVCache.append: the cache is on the {device_of(self._k)}, "
                                 f"the new keys on the {device_of(k)}")
        # Shapes: k and v agree in (B, Hkv, n), and B, Hkv and the head dims match what is cached.
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"KVCache.append: k and v must be (B, Hkv, n, D) with the same "
                             f"first three dims, got k {tuple(k.shape)}, v {tuple(v.shape)}")
        if self._k is not None and (k.shape[:2] != self._k.shape[:2] or
                                    k.shape[3] != self._k.shape[3] or
                                    v.shape[3] != self._v.shape[3]):
            raise ValueError(f"KVCache.append: expected k of shape (B, Hkv, n, D) = "
                             f"{self._k.shape[:2] + ('n', self._k.shape[3])}, got "
                             f"{tuple(k.shape)}")
        # Grow when full (capacity doubles: O(1) amortised copies per token), write the n new
        # tokens after the cached ones; offset marks where this append began.
        n = k.shape[2]
        needed = self.length + n
        if self.max_len is not None and needed > self.max_len:
            raise ValueError(f"KVCache.append: cache is full: {self.length} cached + {n} new > "
                             f"max_len={self.max_len}")
        if self._k is None or needed > self._k.shape[2]:
            self._grow(k, v, needed)
        self._k[:, :, self.length: needed] = k
        self._v[:, :, self.length: needed] = v
        self.offset, self.length = self.length, needed
        return self.keys, self.values


class WindowKVCache:
    """The cache of a sliding-window layer: at most ``window − 1`` past tokens are kept.

    ``append(k, v)`` with k (B, Hkv, n, D), v (B, Hkv, n, Dv) returns the kept keys and the n
    new ones, (B, Hkv, ≤ W − 1 + n, D) Tensors, then drops all but the last W − 1: a later
    query at position p ≥ length needs keys > p − W only. ``len(cache)`` is the number of
    tokens seen (the next token's position), ``first_position`` the position of the first key
    the last ``append`` returned. Memory O(B·Hkv·(W + n)·D); each append copies O(W + n).
    """

    def __init__(self, window: int):
        self.window = validate.positive_int(window, "window", owner="WindowKVCache")
        self.reset()

    def reset(self) -> None:
        """Forget everything cached."""
        self._k = self._v = None
        self.length = 0
        self.offset = 0             # position of the first token of the last append
        self.first_position = 0     # position of the first key the last append returned

    def __len__(self) -> int:
        return self.length

    @property
    def keys(self):
        """The kept keys (B, Hkv, kept, D) as a Tensor (None when empty)."""
        return None if self._k is None else Tensor._wrap(self._k)

    @property
    def values(self):
        """The kept values (B, Hkv, kept, Dv) as a Tensor (None when empty)."""
        return None if self._v is None else Tensor._wrap(self._v)

    def append(self, k, v):
        """Add k (B, Hkv, n, D), v (B, Hkv, n, Dv); return the kept and the new (k, v)."""
        k, v = _raw(k), _raw(v)
        n = k.shape[2] if k.ndim == 4 else 0
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"WindowKVCache.append: k and v must be (B, Hkv, n, D) with the "
                             f"same first three dims, got k {tuple(k.shape)}, v "
                             f"{tuple(v.shape)}")
        if self._k is not None:
            k, v = to_device_of(k, self._k), to_device_of(v, self._k)
            if k.shape[:2] != self._k.shape[:2] or k.shape[3] != self._k.shape[3]:
                raise ValueError(f"WindowKVCache.append: expected k of shape (B, Hkv, n, D) = "
                                 f"{self._k.shape[:2] + ('n', self._k.shape[3])}, got "
                                 f"{tuple(k.shape)}")
            xp = get_array_module(k)
            k = xp.concatenate([self._k, k], axis=2)
            v = xp.concatenate([self._v, v], axis=2)
        # The returned keys end at the newest token; keep only those a later query can see.
        self.offset, self.length = self.length, self.length + n
        self.first_position = self.length - k.shape[2]
        start = self._first_kept() - self.first_position
        self._k, self._v = k[:, :, start:].copy(), v[:, :, start:].copy()
        return Tensor._wrap(k), Tensor._wrap(v)

    def _first_kept(self) -> int:
        """The position of the oldest key the next query can see: the last W − 1 are kept."""
        return max(self.length - (self.window - 1), self.first_position)


class ChunkKVCache(WindowKVCache):
    """The cache of a chunked-attention layer: only the current chunk's tokens are kept.

    ``append(k, v)`` returns the kept keys and the n new ones, then drops every key before the
    chunk of the next position: a query at position p sees keys ⌊p/C⌋·C … p only, so at most
    C − 1 keys are held between calls. ``len(cache)``, ``offset`` and ``first_position`` as
    ``WindowKVCache``'s. Memory O(B·Hkv·(C + n)·D).
    """

    def __init__(self, chunk: int):
        self.chunk = validate.positive_int(chunk, "chunk", owner="ChunkKVCache")
        self.reset()

    def _first_kept(self) -> int:
        """The start of the next position's chunk."""
        return (self.length // self.chunk) * self.chunk


class PagedKVCache:
    """A paged pool of keys/values shared by many sequences (one attention layer).

    Storage: ``k_pages``, ``v_pages`` of shape (num_pages, page_size, Hkv, D). Each sequence
    id has a block table ``block_tables[seq]`` (its page ids in order) and a length; token t
    of a sequence lives in page ``block_tables[seq][t // page_size]`` at slot
    ``t % page_size``. Pages come from ``free_pages`` and return there on ``free(seq)``.

    ``append(seq, k, v)`` with k (Hkv, n, D) stores n tokens and returns the sequence's full
    (k, v) arrays (Hkv, L, D) gathered from its pages. ``view(seq_ids)`` gives a batch adapter
    with ``KVCache``'s ``append`` (B, Hkv, n, D) interface. Raises ``RuntimeError`` when the
    pool runs out of pages.
    """

    def __init__(self, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 value_dim: int = None, dtype="float32", xp=None):
        for name, val in (("num_pages", num_pages), ("page_size", page_size),
                          ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            validate.positive_int(val, name, owner="PagedKVCache")
        value_dim = head_dim if value_dim is None else \
            validate.positive_int(value_dim, "value_dim", owner="PagedKVCache")
        # The pool: num_pages pages of page_size token slots, keys and values apart; every page
        # starts free and no sequence has a block table yet.
        xp = xp or active_xp()
        self.num_pages, self.page_size = num_pages, page_size
        self.num_kv_heads, self.head_dim, self.value_dim = num_kv_heads, head_dim, value_dim
        self.k_pages = xp.zeros((num_pages, page_size, num_kv_heads, head_dim), dtype=dtype)
        self.v_pages = xp.zeros((num_pages, page_size, num_kv_heads, value_dim), dtype=dtype)
        self.free_pages = list(range(num_pages))
        self.block_tables: dict = {}
        self.lengths: dict = {}

    def __contains__(self, seq) -> bool:
        return seq in self.block_tables

    def length(self, seq) -> int:
        return self.lengths.get(seq, 0)

    def free(self, seq) -> None:
        """Return the pages of ``seq`` to the free list."""
        if seq not in self.block_tables:
            raise KeyError(f"PagedKVCache.free: unknown sequence {seq!r}")
        self.free_pages.extend(self.block_tables.pop(seq))
        del self.lengths[seq]

    # Enough pages for new_length tokens, ⌈new_length / page_size⌉ in all, taken from the free
    # list; running out is an error that names the fix.
    def _reserve(self, seq, new_length):
        table = self.block_tables.setdefault(seq, [])
        self.lengths.setdefault(seq, 0)
        need = -(-new_length // self.page_size) - len(table)       # ceil division
        if need > len(self.free_pages):
            raise RuntimeError(
                f"PagedKVCache: out of pages: sequence {seq!r} needs {need} more page(s) of "
                f"{self.page_size} tokens but {len(self.free_pages)} of {self.num_pages} are "
                "free; free finished sequences or create the cache with more num_pages")
        for _ in range(max(need, 0)):
            table.append(self.free_pages.pop(0))
        return table

    def append(self, seq, k, v):
        """Store k (Hkv, n, D), v (Hkv, n, Dv) after ``seq``'s tokens; return its full (k, v).

        Host arrays are copied to the pool's device (once, here)."""
        k, v = (to_device_of(_raw(a), self.k_pages) for a in (k, v))
        expect_k = (self.num_kv_heads, k.shape[1] if k.ndim == 3 else "n", self.head_dim)
        if k.ndim != 3 or tuple(k.shape) != expect_k:
            raise ValueError(f"PagedKVCache.append: k must be (Hkv, n, D) = {expect_k}, got "
                             f"{tuple(k.shape)}")
        if tuple(v.shape) != (self.num_kv_heads, k.shape[1], self.value_dim):
            raise ValueError(f"PagedKVCache.append: v must be (Hkv, n, Dv) = "
                             f"{(self.num_kv_heads, k.shape[1], self.value_dim)}, got "
                             f"{tuple(v.shape)}")
        start, n = self.length(seq), k.shape[1]
        table = self._reserve(seq, start + n)
        pages, slots = self._token_slots(table, start, start + n)
        xp = get_array_module(self.k_pages)
        # (Hkv, n, D) -> (n, Hkv, D): one token per (page, slot)
        self.k_pages[pages, slots] = xp.swapaxes(k, 0, 1)
        self.v_pages[pages, slots] = xp.swapaxes(v, 0, 1)
        self.lengths[seq] = start + n
        return self.gather(seq)

    def _token_slots(self, table, start, stop):
        xp = get_array_module(self.k_pages)
        t = xp.arange(start, stop)
        pages = xp.asarray(table)[t // self.page_size]
        return pages, t % self.page_size

    def gather(self, seq):
        """The cached (k, v) of ``seq`` as contiguous arrays (Hkv, L, D), (Hkv, L, Dv)."""
        if seq not in self.block_tables:
            raise KeyError(f"PagedKVCache.gather: unknown sequence {seq!r}")
        pages, slots = self._token_slots(self.block_tables[seq], 0, self.lengths[seq])
        xp = get_array_module(self.k_pages)
        # (L, Hkv, D) -> (Hkv, L, D)
        return (xp.swapaxes(self.k_pages[pages, slots], 0, 1),
                xp.swapaxes(self.v_pages[pages, slots], 0, 1))

    def view(self, seq_ids):
        """A ``KVCache``-like adapter over the sequences ``seq_ids`` (one per batch row)."""
        return PagedCacheView(self, list(seq_ids))


class PagedCacheView:
    """Batch adapter: ``append(k, v)`` with (B, Hkv, n, D) appends row b to ``seq_ids[b]`` and
    returns the stacked (B, Hkv, L, D) Tensors (all rows must have the same length L)."""

    def __init__(self, cache: PagedKVCache, seq_ids):
        self.cache, self.seq_ids = cache, seq_ids

    @property
    def length(self) -> int:
        return self.cache.length(self.seq_ids[0]) if self.seq_ids else 0

    def __len__(self) -> int:
        return self.length

    # Each batch row appends to its own sequence; the rows stack back into (B, Hkv, L, D), which
    # needs every sequence at the same length.
    def append(self, k, v):
        k, v = _raw(k), _raw(v)
        if k.ndim != 4 or k.shape[0] != len(self.seq_ids):
            raise ValueError(f"PagedCacheView.append: k must be (B={len(self.seq_ids)}, Hkv, n, "
                             f"D), got {tuple(k.shape)}")
        outs = [self.cache.append(s, k[i], v[i]) for i, s in enumerate(self.seq_ids)]
        lengths = {o[0].shape[1] for o in outs}
        if len(lengths) != 1:
            raise ValueError(f"PagedCacheView.append: sequences have different lengths "
                             f"{sorted(lengths)}; attend to them one at a time")
        xp = get_array_module(k)
        return (Tensor._wrap(xp.stack([o[0] for o in outs])),
                Tensor._wrap(xp.stack([o[1] for o in outs])))
