"""Forward hooks that keep each named module's first output tensor of its first call.

Used to measure a fault against the engine noise from the same runs msprobe dumps.

Public API:
    Capture(model)          hooks every named submodule
    capture.stop() -> dict  module name -> fp32 copy of its first output tensor; removes the hooks
"""
from __future__ import annotations

import torch


class Capture:
    def __init__(self, model):
        self.out = {}
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in model.named_modules() if n]

    def _hook(self, name):
        def hook(_module, _inputs, output):
            # linear layers return (output, bias), decoder layers (hidden, residual): keep the first
            if isinstance(output, (tuple, list)):
                output = output[0] if output else None
            if isinstance(output, torch.Tensor) and name not in self.out:
                self.out[name] = output.detach().float().clone()
        return hook

    def stop(self):
        for handle in self.handles:
            handle.remove()
        return self.out
