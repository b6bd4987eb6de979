"""Peak memory of the tensors a forward pass creates, on any device, for benchmarks on CPUs (where no allocator
statistics exist): `with TensorPeak() as tp: ...; tp.peak_mb`.

A `TorchFunctionMode` sees the result of every torch function and tensor method called in the block; each new
storage is counted from its creation until it is freed (weak references on the tensors that own it), views and
in-place results share the storage they came from and add nothing. The peak is the largest total of live new
storages during the block, above what was alive before it (inputs, weights, the carried memory). It sits above
autocast (which works unchanged underneath) and so counts the tensors Python code receives: activations, attention
scores, saved intermediate results; not the temporaries inside one fused or composite operator, nor what the
autograd engine allocates during `backward()` (measure forward passes with it).
"""

from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten


class TensorPeak(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.live = 0  # bytes of storages created inside the block and still alive
        self.peak = 0
        self._refs: dict[int, list] = {}  # storage data pointer → [bytes, live tensors]

    def _release(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._refs[key]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            key = t.untyped_storage().data_ptr()
            if key in inputs and key not in self._refs:
                continue  # a view or an in-place result of a tensor from outside the block
            entry = self._refs.get(key)
            if entry is None:
                entry = self._refs[key] = [t.untyped_storage().nbytes(), 0]
                self.live += entry[0]
                self.peak = max(self.peak, self.live)
            entry[1] += 1
            weakref.finalize(t, self._release, key)
        return out

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20
