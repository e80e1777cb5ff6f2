"""Elementwise maths and normalisations CNN training code calls that the description once refused: torch.reciprocal,
torch.log, F.instance_norm with running statistics, F.normalize: described as torch computes them (the module rebuilt
from the description computes the original's output and gradients), costed as torch runs them, written down by the
allocation model as the meta trace records them, or refused by name with a way around."""
from __future__ import annotations

import torch
from torch import nn

from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.to_torch import build_module

SHAPE = [3, 8, 8]


class _Probe(nn.Module):
    """A convolution's [8, 8, 8] map of an image, ``pattern(y)`` of it, then a classifier of its flattened result
    (``width`` features)."""

    def __init__(self, pattern, width: int = 8 * 8 * 8) -> None:
        super().__init__()
        self.conv, self.pattern, self.fc = nn.Conv2d(3, 8, 3, padding=1), pattern, nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(self.pattern(self.conv(x)).flatten(1))


def _computes_the_same(module: nn.Module, shape: list[int] = SHAPE) -> NetworkDescription:
    """``module``'s description, read back, once the module rebuilt from it, given ``module``'s parameters and
    buffers, has computed at a fixed seed what ``module`` computes in training mode: the same output, the same
    gradient of every parameter and of the input, and the same buffers after (running statistics)."""
    desc = NetworkDescription.from_dict(describe(module, shape, name="probe").to_dict())
    assert desc.params == sum(p.numel() for p in module.parameters())
    rebuilt = build_module(desc)
    for new, old in zip(list(rebuilt.parameters()) + list(rebuilt.buffers()),
                        list(module.parameters()) + list(module.buffers())):
        new.data.copy_(old.data)
    torch.manual_seed(0)
    x = torch.randn(2, *shape)
    outputs, gradients = [], []
    for net in (module.train(), rebuilt.train()):
        xi = x.clone().requires_grad_()
        out = net(xi)
        out.square().sum().backward()
        outputs.append(out)
        gradients.append([xi.grad] + [p.grad for p in net.parameters()])
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    for old, new in zip(*gradients):
        assert torch.allclose(old, new, atol=1e-4)
    for old, new in zip(module.buffers(), rebuilt.buffers()):
        assert torch.allclose(old, new, atol=1e-6)
    return desc


def test_reciprocal_is_the_power_minus_one():
    """torch.reciprocal and x.reciprocal() were refused ("call_function 'reciprocal' has no description op") while
    1 / x described: both are the op pow of exponent -1 (torch's reciprocal kernel, which keeps its result)."""
    desc = _computes_the_same(_Probe(lambda y: torch.reciprocal(y.abs() + 1) + (y.relu() + 2).reciprocal()))
    assert [n.attrs for n in desc.nodes if n.op == "pow"] == [{"exponent": -1.0}] * 2
