"""The running batch's model state in the transformers decode loop: mask, last tokens, KV cache.

Rows of a continuous batch (:mod:`~logtoku_guard.backends.decode_loop`) join by concatenating
their prefilled caches on the batch axis (the shorter side left-padded with masked zeros) and
leave by index selection; the columns only padding fills are cut off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["KVBatch", "mergeable"]


def _pad_left(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """``t`` with ``n`` zeros prepended along ``dim``."""
    import torch

    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class KVBatch:
    """The running batch's model state: ``mask`` ``(rows, columns)`` long (1 = a real token,
    left padding), ``last`` ``(rows,)`` the token each row feeds next, ``cache`` the model's.

    Padding sits on the left of each row, and also between a cached prompt prefix and the rest
    of a shorter prompt (rows prefilled on a prefix: :mod:`~logtoku_guard.backends.prefix_cache`).
    Positions are counted from the mask (a row's real tokens so far), so merging and cutting
    work on whole columns wherever the padding lies.
    """

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.last: torch.Tensor | None = None
        self.cache: Any = None
        self.mergeable = True

    def __len__(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    def extend(self, mask: torch.Tensor, cache: Any) -> None:
        """Append rows (their mask and prefilled cache) after the live ones; the shorter side is left-padded."""
        import torch

        if self.cache is None or self.mask is None:
            self.mask, self.cache = mask, cache
            self.mergeable = mergeable(cache)
            return
        if not (self.mergeable and mergeable(cache)):
            msg = "internal error: rows joined a batch whose cache cannot be merged"
            raise RuntimeError(msg)
        mine, theirs = self.mask.shape[1], mask.shape[1]
        width = max(mine, theirs)
        self.mask = torch.cat([_pad_left(self.mask, width - mine, 1), _pad_left(mask, width - theirs, 1)])
        for ours, new in zip(self.cache.layers, cache.layers, strict=True):
            ours.keys = torch.cat([_pad_left(ours.keys, width - mine, 2), _pad_left(new.keys, width - theirs, 2)])
            ours.values = torch.cat([_pad_left(ours.values, width - mine, 2), _pad_left(new.values, width - theirs, 2)])

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in this order); cut the columns that only padding fills."""
        import torch

        if self.mask is None or self.last is None:
            return
        if not rows:
            self.mask = self.last = self.cache = None
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self.mask.device)
        self.mask, self.last = self.mask[index], self.last[index]
        self.cache.batch_select_indices(index)
        used = self.mask.any(dim=0)
        if not self.mergeable or bool(used.all()):
            return
        cols = used.nonzero().squeeze(1)
        first, count = int(cols[0]), len(cols)
        if int(cols[-1]) - first + 1 == count:  # only leading columns to cut: views, no copy
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            return
        self.mask = self.mask[:, cols]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, cols], layer.values[:, :, cols]


def mergeable(cache: Any) -> bool:
    """A cache of plain full-attention ``DynamicLayer`` s (its tensors can be padded and concatenated)."""
    from transformers.cache_utils import DynamicLayer

    layers: list[Any] = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(type(layer) is DynamicLayer and layer.keys is not None for layer in layers)
