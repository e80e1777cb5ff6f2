"""Hand-built network descriptions for feature tests (no torch needed)."""
from __future__ import annotations

from perf4sight.ir.schema import NetworkDescription, Node, count_params


def conv_node(name, src, cin, cout, k, groups, out_hw, bias=False, stride=1):
    """A square ``k`` x ``k`` conv2d node with 'same' padding and output ``[cout, out_hw, out_hw]``."""
    return Node(name, "conv2d", [src], {"in_channels": cin, "out_channels": cout, "kernel_size": [k, k],
                                        "stride": [stride, stride], "padding": [k // 2, k // 2], "dilation": [1, 1],
                                        "groups": groups, "bias": bias}, [cout, out_hw, out_hw])


def tiny_description(nodes, shape=(4, 8, 8)):
    """A description named 'tiny' over ``nodes`` (the last is the output), 5 classes, params counted."""
    d = NetworkDescription("tiny", "tiny", list(shape), 5, 0, nodes, nodes[-1].name)
    d.params = count_params(d)
    return d
