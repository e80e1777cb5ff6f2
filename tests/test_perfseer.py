"""PerfSeer dataset import/export: string-typed fields, hostile pickles and labels, round trip."""
from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import torch
from torch import nn

from perf4sight.errors import UserError
from perf4sight.exporters import export_perfseer
from perf4sight.features.aggregate import network_features
from perf4sight.importers.perfseer import import_perfseer, read_graph, read_label
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import load_description
from perf4sight.profiling.results import file_sha, read_rows, results_path

LABEL = "{'train': '12.5|40.0|10.0|900.0|95.0|30.0|1234.5', 'infer': '3.0|20|5|500|50|10|700'}"


def _node(g, name, typ, out, args=None, **mi):
    g.add_node(name, feature={"type": typ, "args": args or {}, "flops": "1000", "arith_intensity": "1.5",
                              "memory_info": {"batch_size": "4", "output_shape": out, **mi}})


def _perfseer_graph() -> nx.DiGraph:
    """conv -> bn -> relu -> maxpool -> (conv -> relu) + identity branch -> add -> cat -> gap -> flatten -> gemm."""
    g = nx.DiGraph()
    _node(g, "conv1", "Conv", ["4", "8", "16", "16"],
          {"kernel_shape": ["3", "3"], "strides": "1", "pads": [1, 1, 1, 1], "group": "1", "bias": "false"},
          input_shape="[4, 3, 16, 16]")
    _node(g, "bn1", "BatchNormalization", [4, 8, 16, 16])
    _node(g, "relu1", "Relu", [4, 8, 16, 16])
    _node(g, "pool", "MaxPool", [4, 8, 8, 8], {"kernel_shape": [2, 2], "strides": [2, 2]})
    _node(g, "conv2", "Conv", [4, 8, 8, 8], {"in_channels": "8", "out_channels": "8", "kernel_size": "3",
                                             "padding": "1", "bias": True})
    _node(g, "relu2", "Relu", [4, 8, 8, 8])
    _node(g, "add", "Add", [4, 8, 8, 8])
    _node(g, "cat", "Concat", [4, 16, 8, 8], {"axis": "1"})
    _node(g, "gap", "GlobalAveragePool", [4, 16, 1, 1])
    _node(g, "flat", "Flatten", [4, 16])
    _node(g, "fc", "Gemm", [4, 10], {"in_features": "16", "out_features": "10"})
    for a, b in [("conv1", "bn1"), ("bn1", "relu1"), ("relu1", "pool"), ("pool", "conv2"), ("conv2", "relu2"),
                 ("relu2", "add"), ("pool", "add"), ("add", "cat"), ("pool", "cat"), ("cat", "gap"),
                 ("gap", "flat"), ("flat", "fc")]:
        g.add_edge(a, b)
    return g


def test_import_string_typed_graph(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny_bs4.pkl").write_bytes(pickle.dumps(_perfseer_graph()))
    (src / "tiny_bs4.txt").write_text(LABEL)
    s = import_perfseer(src, "gpu", tmp_path / "prof", tmp_path / "models")
    assert (s.rows_written, s.descriptions, s.networks) == (1, 1, ["tiny"])
    desc = load_description(tmp_path / "models" / "imported" / "gpu" / "tiny.json")
    assert desc.input_shape == [3, 16, 16] and desc.output == "fc"
    conv1 = desc.node("conv1").attrs
    assert conv1["kernel_size"] == [3, 3] and conv1["padding"] == [1, 1] and conv1["bias"] is False
    assert conv1["in_channels"] == 3 and conv1["out_channels"] == 8
    assert desc.node("cat").attrs["dim"] == 1 and desc.node("fc").op == "linear"
    assert desc.node("add").inputs == ["pool", "relu2"]
    assert desc.params == 3 * 8 * 9 + 16 + 8 * 8 * 9 + 8 + 16 * 10 + 10
    assert not network_features(desc).unsupported
    (row,) = read_rows(results_path(tmp_path / "prof", "gpu"))
    assert row["batch_size"] == "4" and row["phase"] == "train" and row["backend"] == "imported"
    assert float(row["latency_ms_median"]) == 12.5 and float(row["device_mem_used_mb"]) == 1234.5
    again = import_perfseer(src, "gpu", tmp_path / "prof", tmp_path / "models")
    assert again.rows_written == 0 and again.rows_skipped_existing == 1
    # a second graph of the network (another batch size, another file named in its `source`): its row is
    # measured on the description file saved from the first graph, not on a text that was never saved
    at4, at8 = _perfseer_graph(), _perfseer_graph()
    for _, data in at8.nodes(data=True):
        mi = data["feature"]["memory_info"]
        mi["batch_size"], mi["output_shape"] = "8", [type(mi["output_shape"][0])(8)] + list(mi["output_shape"][1:])
        if "input_shape" in mi:
            mi["input_shape"] = mi["input_shape"].replace("[4,", "[8,")
    both = tmp_path / "both"
    both.mkdir()
    for graph, b in ((at4, 4), (at8, 8)):  # no name in the graphs: the files' stems less the batch size name it
        (both / f"tiny_bs{b}.pkl").write_bytes(pickle.dumps(graph))
        (both / f"tiny_bs{b}.txt").write_text(LABEL)
    import_perfseer(both, "gpu2", tmp_path / "prof", tmp_path / "models")
    saved = file_sha((tmp_path / "models" / "imported" / "gpu2" / "tiny.json").read_bytes())
    assert [r["description_sha"] for r in read_rows(results_path(tmp_path / "prof", "gpu2"))] == [saved, saved]


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_pickle",))


def test_hostile_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"graph": _Evil()}))
    with pytest.raises(UserError, match="forbidden type"):
        read_graph(tmp_path / "evil.pkl")
    assert not (tmp_path / "pwned_by_pickle").exists()
    (tmp_path / "tensor.pkl").write_bytes(pickle.dumps(torch.zeros(2)))
    with pytest.raises(UserError, match="not a safe PerfSeer graph"):
        read_graph(tmp_path / "tensor.pkl")
    (tmp_path / "list.pkl").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(UserError, match="not a networkx directed graph"):
        read_graph(tmp_path / "list.pkl")


@pytest.mark.parametrize("text, match", [
    ("{'train': __import__('os').system('touch pwned_by_label')}", "not a Python dict literal"),
    ("{'train': '1|2|3'}", "expected 7"),
    ("{'train': '1|2|3|4|x|6|7'}", "non-numeric"),
    ("['1|2|3|4|5|6|7']", "must be a dict"),
    ("{'train': ", "not a Python dict literal"),
    # an infinite figure was imported as an empty cell, "not measured", where nan alone means that
    ("{'train': '12|nan|nan|nan|nan|nan|inf'}", r"\[train\]: peak_memory_usuage is infinite \(inf\)"),
    ("{'train': '1e400|nan|nan|nan|nan|nan|7'}", r"\[train\]: time is infinite"),
])
def test_malformed_label(tmp_path, monkeypatch, text, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.txt").write_text(text)
    with pytest.raises(UserError, match=match):
        read_label(tmp_path / "g.txt")
    assert not (tmp_path / "pwned_by_label").exists()


def test_unsupported_op_and_missing_label(tmp_path):
    g = _perfseer_graph()
    g.nodes["relu2"]["feature"]["type"] = "LSTM"
    (tmp_path / "a_bs4.pkl").write_bytes(pickle.dumps(g))
    (tmp_path / "a_bs4.txt").write_text(LABEL)
    with pytest.raises(UserError, match="unsupported op type 'LSTM'"):
        import_perfseer(tmp_path, "gpu", tmp_path / "prof", tmp_path / "models")
    (tmp_path / "a_bs4.txt").unlink()
    with pytest.raises(UserError, match="no label file"):
        import_perfseer(tmp_path, "gpu", tmp_path / "prof", tmp_path / "models")


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.branch = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        y = torch.cat([self.branch(x) + x, x], dim=1)
        return self.fc(torch.flatten(self.pool(y), 1))


def test_export_import_round_trip(tmp_path):
    desc = describe(_Tiny(), input_shape=[3, 16, 16], name="tiny_l0", network="tiny")
    rows = [{"device": "d", "network": "tiny_l0", "batch_size": b, "status": "ok", "phase": "train",
             "latency_ms_median": 10.0 * b, "device_mem_used_mb": 100.0 + b, "gpu_util_pct": ""} for b in (2, 8)]
    rows.append({"device": "d", "network": "tiny_l0", "batch_size": 64, "status": "oom", "phase": "train"})
    summary = export_perfseer(rows, {"tiny_l0": desc}, tmp_path / "ds")
    assert summary["graphs_written"] == 2
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [
        "tiny_l0_bs2.pkl", "tiny_l0_bs2.txt", "tiny_l0_bs8.pkl", "tiny_l0_bs8.txt"]
    label = read_label(tmp_path / "ds" / "tiny_l0_bs8.txt")
    assert label["train"]["time"] == 80.0 and label["train"]["peak_memory_usuage"] == 108.0
    imp = import_perfseer(tmp_path / "ds", "d2", tmp_path / "prof", tmp_path / "models")
    assert imp.networks == ["tiny_l0"] and imp.rows_written == 2
    back = load_description(tmp_path / "models" / "imported" / "d2" / "tiny_l0.json")
    assert back.input_shape == desc.input_shape and back.params == desc.params and back.network == "tiny"
    assert back.to_dict() == desc.to_dict()
    a, b = network_features(desc), network_features(back)
    assert a.per_sample == b.per_sample and a.static == b.static
    got = {int(r["batch_size"]): float(r["latency_ms_median"])
           for r in read_rows(results_path(tmp_path / "prof", "d2"))}
    assert got == {2: 20.0, 8: 80.0}
    # two names one file name would hold ('my net', 'my+net' -> my_net_bs2): refused, nothing written
    twins = {n: dataclasses.replace(desc, name=n) for n in ("my net", "my+net")}
    with pytest.raises(UserError, match=r"networks 'my net' and 'my\+net' would both be written as my_net_bs2.pkl"):
        export_perfseer([dict(rows[0], network=n) for n in twins], twins, tmp_path / "twins")
    assert not (tmp_path / "twins").exists()
    # one network at one batch size measured at two input shapes: the second replaced the first, counted twice
    with pytest.raises(UserError, match=r"network 'tiny_l0' has rows at batch size 2 of two input shapes \(\S* and "
                                        r"3x64x64\), which would both be written as tiny_l0_bs2.pkl"):
        export_perfseer([rows[0], dict(rows[0], input_shape="3x64x64")], {"tiny_l0": desc}, tmp_path / "shapes")
    assert not (tmp_path / "shapes").exists()

    # --output where no folder can be made (under a file): one line naming it, exit 2, no traceback
    (tmp_path / "config.toml").write_text('[project]\nprofiling_dir = "prof"\nmodels_dir = "models"\n'
                                          '[devices.local]\nbackend = "cpu"\n')
    (tmp_path / "afile").write_text("x")
    main = Path(__file__).resolve().parents[1] / "main.py"
    proc = subprocess.run([sys.executable, str(main), "--config", str(tmp_path / "config.toml"), "--stage", "export",
                           "--format", "perfseer", "--output", str(tmp_path / "afile" / "sub"), "--device", "d2"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: export: cannot write {tmp_path / 'afile' / 'sub'} (")


def test_rows_of_another_backend_are_refused_before_anything_is_written(tmp_path):
    """A device whose rows were imported from a foreign dataset takes no rows of this tool's cpu backend (an
    export of a profiled device): nothing is written, not even the description."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny_bs4.pkl").write_bytes(pickle.dumps(_perfseer_graph()))
    (src / "tiny_bs4.txt").write_text(LABEL)
    import_perfseer(src, "gpu", tmp_path / "prof", tmp_path / "models")
    csv_path = results_path(tmp_path / "prof", "gpu")
    before = csv_path.read_bytes()
    desc = describe(_Tiny(), input_shape=[3, 16, 16], name="tiny_l0", network="tiny")
    rows = [{"device": "local", "backend": "cpu", "network": "tiny_l0", "batch_size": 2, "status": "ok",
             "phase": "train", "latency_ms_median": 20.0, "peak_rss_mb": 700.0}]
    export_perfseer(rows, {"tiny_l0": desc}, tmp_path / "ds", "peak_rss_mb")
    with pytest.raises(UserError, match=r"prof/gpu/measurements.csv holds imported \(perfseer\) rows and the source "
                                        r"brings cpu rows for device 'gpu'.*another --device name; nothing written"):
        import_perfseer(tmp_path / "ds", "gpu", tmp_path / "prof", tmp_path / "models")
    assert csv_path.read_bytes() == before
    assert not (tmp_path / "models" / "imported" / "gpu" / "tiny_l0.json").exists()
    assert import_perfseer(tmp_path / "ds", "cpu-copy", tmp_path / "prof", tmp_path / "models").rows_written == 1
    # an export of several devices (one folder each), imported whole: the line says to take one folder at a time
    both = tmp_path / "both"
    shutil.copytree(src, both / "gpu")
    shutil.copytree(tmp_path / "ds", both / "local")
    with pytest.raises(UserError, match=r"the source brings rows of 2 backends \(cpu/imported \(perfseer\)\) for "
                                        r"device 'new'; .*one folder per device \(gpu, local\).*e.g. --source "
                                        r".*both/gpu; nothing"):
        import_perfseer(both, "new", tmp_path / "prof", tmp_path / "models")
    assert not results_path(tmp_path / "prof", "new").exists()
    # two devices' exports, each of one backend, one at a time into one device: mixed unsaid; refused now
    rows[0]["device_model"] = "Some CPU"
    export_perfseer(rows, {"tiny_l0": desc}, tmp_path / "ds2", "peak_rss_mb")
    desc.name = rows[0]["network"] = "tiny_l1"
    rows[0]["device_model"] = "Another CPU"
    export_perfseer(rows, {"tiny_l1": desc}, tmp_path / "ds3", "peak_rss_mb")
    assert import_perfseer(tmp_path / "ds2", "cpus", tmp_path / "prof", tmp_path / "models").rows_written == 1
    with pytest.raises(UserError, match=r"cpus/measurements.csv holds rows measured on Some CPU and the source's were "
                                        r"measured on Another CPU \(column device_model\)"):
        import_perfseer(tmp_path / "ds3", "cpus", tmp_path / "prof", tmp_path / "models")


def _onnx_views_graph() -> nx.DiGraph:
    """conv -> Transpose(perm) -> Slice(starts/ends/axes) -> Unsqueeze(axes) -> Squeeze(no axes) -> Gather -> Gelu
    -> Swish -> Reshape (an ONNX target shape, batch included) -> Gemm, in ONNX's attribute names only."""
    g = nx.DiGraph()
    _node(g, "conv", "Conv", [4, 8, 6, 6], {"kernel_shape": [3, 3]}, input_shape=[4, 3, 8, 8])
    _node(g, "tr", "Transpose", [4, 8, 6, 6], {"perm": [0, 1, 3, 2]})
    _node(g, "sl", "Slice", [4, 8, 2, 6], {"starts": [1], "ends": [3], "axes": [2]})
    _node(g, "un", "Unsqueeze", [4, 1, 8, 2, 6], {"axes": "[1]"})
    _node(g, "sq", "Squeeze", [4, 8, 2, 6])
    _node(g, "ga", "Gather", [4, 8, 6], {"axis": 2, "indices": 0})
    _node(g, "ge", "Gelu", [4, 8, 6])
    _node(g, "sw", "Swish", [4, 8, 6])
    _node(g, "re", "Reshape", [4, 48], {"shape": [4, 48]})
    _node(g, "fc", "Gemm", [4, 10])
    names = ["conv", "tr", "sl", "un", "sq", "ga", "ge", "sw", "re", "fc"]
    g.add_edges_from(zip(names, names[1:]))
    return g


def test_onnx_named_view_ops(tmp_path):
    """Another tool's ONNX attributes (perm, starts/ends/axes, indices, a batch-including reshape target)
    become our attributes, and the description rebuilds into a module giving [N, 10]."""
    from perf4sight.importers.perfseer import graph_to_description
    from perf4sight.ir.to_torch import build_module

    desc, batch = graph_to_description(_onnx_views_graph(), "v", "v.pkl")
    attrs = {n.name: (n.op, n.attrs) for n in desc.nodes}
    assert batch == 4 and attrs["tr"] == ("transpose", {"dim0": 2, "dim1": 3})
    assert attrs["sl"] == ("narrow", {"dim": 2, "start": 1, "length": 2})
    assert attrs["un"] == ("unsqueeze", {"dim": 1}) and attrs["sq"] == ("squeeze", {"dim": 1})
    assert attrs["ga"] == ("select", {"dim": 2, "index": 0})
    assert attrs["ge"][0] == "gelu" and attrs["sw"][0] == "silu" and attrs["re"] == ("reshape", {"shape": [48]})
    assert list(build_module(desc)(torch.randn(2, 3, 8, 8)).shape) == [2, 10]
    g = _onnx_views_graph()
    g.nodes["tr"]["feature"]["args"] = {"perm": [0, 2, 3, 1]}  # three axes moved: a permute, whose shape is wrong
    with pytest.raises(UserError, match=r"'tr' \(permute\): output_shape \[8, 6, 6\], but its input \[8, 6, 6\] "
                                        r"gives \[6, 6, 8\]"):
        graph_to_description(g, "v", "v.pkl")
    g.nodes["tr"]["feature"]["args"] = {"perm": [0, 1, 2, 3]}  # nothing moved
    with pytest.raises(UserError, match="perm swapping two axes"):
        graph_to_description(g, "v", "v.pkl")


def _graph_at(batch: int) -> nx.DiGraph:
    """:func:`_perfseer_graph` measured at ``batch``."""
    g = _perfseer_graph()
    for _, data in g.nodes(data=True):
        mi = data["feature"]["memory_info"]
        mi["batch_size"], mi["output_shape"] = str(batch), [batch] + list(mi["output_shape"][1:])
        if "input_shape" in mi:
            mi["input_shape"] = mi["input_shape"].replace("[4,", f"[{batch},")
    return g


def test_a_name_ending_in_the_digits_of_its_batch_size_is_kept(tmp_path):
    """Separator and marker were both optional before the batch size: ``bs8/resnet18.pkl`` at batch 8 was
    imported as a network ``resnet1``. Only a batch size after a separator or a bs/b/batch marker is dropped."""
    from perf4sight.importers.perfseer import _variant_name
    src = tmp_path / "src"
    for b in (4, 8):  # one folder per batch size, the files named after the network
        (src / f"bs{b}").mkdir(parents=True)
        (src / f"bs{b}" / "resnet18.pkl").write_bytes(pickle.dumps(_graph_at(b)))
        (src / f"bs{b}" / "resnet18.txt").write_text(LABEL)
    s = import_perfseer(src, "gpu", tmp_path / "prof", tmp_path / "models")
    assert (s.networks, s.descriptions, s.rows_written) == (["resnet18"], 1, 2)
    rows = read_rows(results_path(tmp_path / "prof", "gpu"))
    assert [(r["network"], r["family"], r["batch_size"]) for r in rows] == [("resnet18", "resnet18", "4"),
                                                                            ("resnet18", "resnet18", "8")]
    unnamed = nx.DiGraph()
    for stem, batch, name in (("resnet18", 8, "resnet18"), ("resnet18", 18, "resnet18"), ("net_18", 8, "net_18"),
                              ("net_b18", 8, "net_b18"), ("net8", 8, "net8"), ("bs8", 8, "bs8"),
                              ("tiny_bs4", 4, "tiny"), ("tiny_l0_bs8", 8, "tiny_l0"), ("net-8", 8, "net"),
                              ("net_batch_8", 8, "net"), ("net_b8", 8, "net"), ("netbs8", 8, "net"),
                              ("resnet18_bs16", 16, "resnet18"), ("tiny_bs4", 8, "tiny_bs4")):
        assert _variant_name(unnamed, stem, batch) == name, (stem, batch)


def test_graphs_pickled_with_protocols_0_and_1_are_read(tmp_path, monkeypatch):
    """Protocols 0 and 1 make objects with ``copyreg._reconstructor``, which the allow-list refused: such a graph
    could not be imported at all. It is allowed for the networkx classes on base ``object`` only (where it is
    ``object.__new__(cls)``); with another class or base, or a forbidden global, a hostile pickle is still refused."""
    graph = _perfseer_graph()
    graph.graph["tags"] = {"a", "b"}  # a set: protocols 0 to 2 name it __builtin__.set
    _ = graph.nodes, graph.adj, graph.pred, graph.in_degree  # cached views, pickled with the graph
    imported = {}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        src = tmp_path / f"p{protocol}"
        src.mkdir()
        (src / "tiny_bs4.pkl").write_bytes(pickle.dumps(graph, protocol=protocol))
        (src / "tiny_bs4.txt").write_text(LABEL)
        back = read_graph(src / "tiny_bs4.pkl")
        assert type(back) is nx.DiGraph and nx.utils.graphs_equal(back, graph) and back.graph["tags"] == {"a", "b"}
        assert list(back.predecessors("add")) == ["relu2", "pool"] and back.nodes["fc"] == graph.nodes["fc"]
        s = import_perfseer(src, f"gpu{protocol}", tmp_path / "prof", tmp_path / "models")
        assert (s.networks, s.rows_written) == (["tiny"], 1)
        (row,) = read_rows(results_path(tmp_path / "prof", f"gpu{protocol}"))
        desc = (tmp_path / "models" / "imported" / f"gpu{protocol}" / "tiny.json").read_text()
        imported[protocol] = ({k: v for k, v in row.items() if k not in ("device", "timestamp")}, desc)
    assert all(v == imported[4] for v in imported.values())

    monkeypatch.chdir(tmp_path)
    for protocol in (0, 1):
        (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"graph": _Evil()}, protocol=protocol))
        with pytest.raises(UserError, match="forbidden type"):
            read_graph(tmp_path / "evil.pkl")
    digraph = b"cnetworkx.classes.digraph\nDiGraph\n"
    for args, what in ((b"c__builtin__\ndict\nc__builtin__\ndict\n(dt", "dict"),  # a base whose __new__ would run
                       (digraph + digraph + b"(dt", "DiGraph"),  # DiGraph.__init__(obj, state)
                       (digraph + b"c__builtin__\nobject\n(dt", "DiGraph"),  # a state for object: refused too
                       (b"c__builtin__\nset\nc__builtin__\nobject\nNt", "set")):
        (tmp_path / "evil.pkl").write_bytes(b"ccopy_reg\n_reconstructor\n(" + args + b"R.")
        with pytest.raises(UserError, match=rf"not a safe PerfSeer graph pickle \(UnpicklingError: forbidden "
                                            rf"copyreg._reconstructor of {what} \(only networkx graph classes"):
            read_graph(tmp_path / "evil.pkl")
    (tmp_path / "evil.pkl").write_bytes(b"ccopy_reg\n__newobj__\n.")
    with pytest.raises(UserError, match=r"forbidden type copyreg.__newobj__"):
        read_graph(tmp_path / "evil.pkl")
    assert not (tmp_path / "pwned_by_pickle").exists()


def test_sources_that_would_mix_or_invent_measurements_are_refused(tmp_path):
    """Two devices' folders holding one network at one batch size kept one file's row and called the other
    "already imported"; a PerfSeer source went into a device of perf4sight rows (both `imported`); a file named
    for batch 4 whose graph says 99 invented a network `tiny_bs4`; an all-nan label was an ok row without figures;
    a dangling graph link was a bare OS error."""
    two = tmp_path / "two"
    for folder, ms in (("rtx3090", "12.5"), ("a100", "5.0")):
        (two / folder).mkdir(parents=True)
        (two / folder / "tiny_bs4.pkl").write_bytes(pickle.dumps(_perfseer_graph()))
        (two / folder / "tiny_bs4.txt").write_text(LABEL.replace("12.5", ms))
    with pytest.raises(UserError, match=r"rtx3090/tiny_bs4.pkl: tiny at batch size 4 \(train\) is measured in "
                                        r".*a100/tiny_bs4.pkl too: .*one folder per device \(a100, rtx3090\)"):
        import_perfseer(two, "gpu", tmp_path / "prof", tmp_path / "models")
    assert not (tmp_path / "prof").exists() and not (tmp_path / "models").exists()

    from perf4sight.importers.perf4sight_csv import PROTOCOL
    from perf4sight.profiling.results import append_row
    append_row(results_path(tmp_path / "prof", "tx2"), {"device": "tx2", "backend": "imported", "protocol": PROTOCOL,
                                                         "network": "a_0", "batch_size": 2, "status": "ok",
                                                         "timestamp": "2026-11-29T00:00:00+00:00"})
    with pytest.raises(UserError, match=r"holds imported \(perf4sight_mean3\) rows and the source brings imported "
                                        r"\(perfseer\) rows for device 'tx2'"):
        import_perfseer(two / "a100", "tx2", tmp_path / "prof", tmp_path / "models")

    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "tiny_bs4.pkl").write_bytes(pickle.dumps(_graph_at(99)))
    (odd / "tiny_bs4.txt").write_text(LABEL)
    with pytest.raises(UserError, match=r"tiny_bs4.pkl: the file name says batch size 4, its graph's memory_info "
                                        r"batch_size 99"):
        import_perfseer(odd, "gpu", tmp_path / "prof", tmp_path / "models")

    failed = tmp_path / "failed"
    failed.mkdir()
    for b, label in ((4, LABEL), (8, "{'train': 'nan|nan|nan|nan|nan|nan|nan'}")):
        (failed / f"tiny_bs{b}.pkl").write_bytes(pickle.dumps(_graph_at(b)))
        (failed / f"tiny_bs{b}.txt").write_text(label)
    s = import_perfseer(failed, "gpu", tmp_path / "prof", tmp_path / "models")
    assert (s.rows_written, s.ok, s.error) == (2, 1, 1)
    assert [r["status"] for r in read_rows(results_path(tmp_path / "prof", "gpu"))] == ["ok", "error"]
    (failed / "tiny_bs8.txt").write_text("{'train': '-3|nan|nan|nan|nan|nan|nan'}")
    with pytest.raises(UserError, match=r"tiny_bs8.txt \[train\]: time is negative \(-3\)"):
        import_perfseer(failed, "gpu3", tmp_path / "prof", tmp_path / "models")

    (failed / "tiny_bs8.txt").write_text(LABEL)
    (failed / "tiny_bs8.pkl").unlink()
    (failed / "tiny_bs8.pkl").symlink_to(failed / "gone.pkl")
    with pytest.raises(UserError, match=r"tiny_bs8.pkl: cannot read the PerfSeer graph \(No such file"):
        import_perfseer(failed, "gpu4", tmp_path / "prof", tmp_path / "models")


def test_a_bias_an_onnx_graph_gives_as_an_input_is_read_off_the_weight_size(tmp_path):
    """ONNX gives a convolution's or linear layer's bias as a third input, never an attribute: a graph from
    another tool without a `bias` arg was read with a bias on every layer (mobilenetv2 +23% step time on the TX2
    fingerprint). The node's weight_size (bytes of weights and bias) says which."""
    g = _perfseer_graph()
    del g.nodes["conv1"]["feature"]["args"]["bias"]
    g.nodes["conv1"]["feature"]["memory_info"]["weight_size"] = str(4 * 8 * 3 * 9)  # weights alone, fp32
    g.nodes["conv2"]["feature"]["args"].pop("bias")
    g.nodes["conv2"]["feature"]["memory_info"]["weight_size"] = 2 * (8 * 8 * 9 + 8)  # weights and bias, fp16
    g.nodes["fc"]["feature"]["memory_info"]["weight_size"] = 4 * 16 * 10  # no bias
    (tmp_path / "tiny_bs4.pkl").write_bytes(pickle.dumps(g))
    (tmp_path / "tiny_bs4.txt").write_text(LABEL)
    import_perfseer(tmp_path, "gpu", tmp_path / "prof", tmp_path / "models")
    desc = load_description(tmp_path / "models" / "imported" / "gpu" / "tiny.json")
    assert [desc.node(n).attrs["bias"] for n in ("conv1", "conv2", "fc")] == [False, True, False]
    assert desc.params == 3 * 8 * 9 + 16 + 8 * 8 * 9 + 8 + 16 * 10


def test_a_label_without_a_training_step_is_noted(tmp_path):
    """A label with an 'infer' entry only made no row and the import said nothing of it."""
    src = tmp_path / "src"
    src.mkdir()
    for name, label in (("tiny_bs4", LABEL), ("tiny_bs8", "{'infer': '3.0|20|5|500|50|10|700'}")):
        g = _perfseer_graph()
        for _, data in g.nodes(data=True):
            mi = data["feature"]["memory_info"]
            mi["batch_size"] = name[-1]
            mi["output_shape"] = [int(name[-1])] + [int(v) for v in mi["output_shape"][1:]]
            if "input_shape" in mi:
                mi["input_shape"] = mi["input_shape"].replace("[4,", f"[{name[-1]},")
        (src / f"{name}.pkl").write_bytes(pickle.dumps(g))
        (src / f"{name}.txt").write_text(label)
    summary = import_perfseer(src, "gpu", tmp_path / "prof", tmp_path / "models")
    assert (summary.rows_written, summary.without_phase) == (1, ["tiny_bs8.txt"])
    config = tmp_path / "config.toml"
    config.write_text("")
    run = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "main.py"), "--config", str(config),
                          "--stage", "import", "--format", "perfseer", "--source", str(src), "--device", "gpu2"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "note: gpu2: 1 label file held no training step's figures (no 'train' entry: tiny_bs8.txt)" in run.stderr


@pytest.mark.parametrize("args", [{"keepdim": False}, {"dims": None}])
def test_a_variance_without_its_dims_is_refused_naming_file_and_node(args):
    """A ReduceVariance node (this tool's own type) without ``dims`` stopped the import with a bare KeyError: 'dims'.
    A variance's dimensions are never implied (a mean's are), so it is refused naming the file and the node."""
    from perf4sight.importers.perfseer import graph_to_description

    g = nx.DiGraph()
    _node(g, "conv", "Conv", [4, 8, 6, 6], {"kernel_shape": [3, 3], "bias": False}, input_shape="[4, 3, 8, 8]")
    _node(g, "var", "ReduceVariance", [4, 8], args)
    _node(g, "fc", "Gemm", [4, 10])
    g.add_edges_from([("conv", "var"), ("var", "fc")])
    with pytest.raises(UserError, match=r"^v.pkl node 'var': ReduceVariance lacks 'dims' in args$"):
        graph_to_description(g, "v", "v.pkl")
    g.nodes["var"]["feature"]["args"] = {"dims": [2, 3]}
    assert graph_to_description(g, "v", "v.pkl")[0].node("var").attrs["dims"] == [2, 3]


def test_a_foreign_matmul_by_a_weight_is_a_linear_layer_without_a_bias(tmp_path):
    """ONNX's MatMul of two activations is the op matmul; one of an activation alone (its weight an initializer, not
    a graph node: an exporter's linear layer without a bias) is a linear layer of the shapes' features, no bias
    whatever its weight_size says (a MatMul adds none: ONNX's Gemm may)."""
    g = _perfseer_graph()
    g.nodes["fc"]["feature"].update(type="MatMul", args={})
    g.nodes["fc"]["feature"]["memory_info"]["weight_size"] = 4 * (16 * 10 + 10)
    (tmp_path / "tiny_bs4.pkl").write_bytes(pickle.dumps(g))
    (tmp_path / "tiny_bs4.txt").write_text(LABEL)
    import_perfseer(tmp_path, "gpu", tmp_path / "prof", tmp_path / "models")
    fc = load_description(tmp_path / "models" / "imported" / "gpu" / "tiny.json").node("fc")
    assert (fc.op, fc.attrs) == ("linear", {"in_features": 16, "out_features": 10, "bias": False})


@pytest.mark.parametrize("epsilon, attrs", [("1e-05", {}), ("0.001", {"eps": 0.001})])
def test_a_foreign_batch_norm_s_epsilon_is_read_where_it_is_not_torch_s(epsilon, attrs):
    """ONNX's BatchNormalization gives its epsilon always: one of torch's 1e-5 is left out, as a description leaves
    it out (a file imported before keeps its description), another is the attr ``eps``."""
    from perf4sight.importers.perfseer import graph_to_description

    g = _perfseer_graph()
    g.nodes["bn1"]["feature"]["args"] = {"epsilon": epsilon}
    desc = graph_to_description(g, "tiny", "tiny_bs4.pkl")[0]
    assert [n.attrs for n in desc.nodes if n.op == "batchnorm2d"] == [{"num_features": 8, **attrs}]
