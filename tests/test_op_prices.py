"""The ops between the convolutions at the device's prices: measured on this CPU (``profiling/op_prices.py``, by the
runner after a sweep, once), summed per network (``features/priced_ops.py``), a step-time term kept in a fingerprint."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch.nn as nn

from perf4sight.errors import UserError
from perf4sight.features.aggregate import FEATURE_NAMES, feature_matrix, network_features
from perf4sight.features.priced_ops import check_prices, load_op_prices, prices_key, priced_ms_per_sample
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description
from perf4sight.profiling.op_prices import MIN_SIDE, PRICED_OPS, SIDES, measure_prices
from perf4sight.profiling.plan import TestPlan, save_plan
from perf4sight.profiling.runner import run_plan

SHAPE = [3, 16, 16]


def small() -> nn.Module:
    """conv -> batch norm -> ReLU (16x16, 8 channels) -> 3x3 max pool, stride 2 (8x8) -> global pool -> linear."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def test_the_prices_of_every_kind_are_measured_at_every_side():
    data = measure_prices(threads=1, ops=["relu", "batchnorm2d", "maxpool2d", "adaptiveavgpool2d", "layernorm",
                                          "cat"])
    table = check_prices(json.loads(json.dumps(data)), "measured")  # JSON-able, and read back as written
    assert data["threads"] == 1 and data["torch_version"]
    assert set(table) == {"relu", "batchnorm2d", "maxpool2d", "adaptiveavgpool2d", "layernorm", "cat"}
    for op, by_side in table.items():
        assert sorted(by_side) == list(SIDES), op
        assert all(math.isfinite(v) and v >= 0 for v in by_side.values()) and max(by_side.values()) > 0, op


def test_a_network_is_priced_by_its_elements_at_its_maps_sides():
    desc = describe(small(), SHAPE, name="small")
    sides = {s: float(s) for s in SIDES}  # a price that names its side
    table = {"batchnorm2d": sides, "relu": {s: 1.0 for s in SIDES}, "maxpool2d": {s: 2.0 for s in SIDES},
             "adaptiveavgpool2d": {s: 3.0 for s in SIDES}}
    ns = (8 * 16 * 16 * 16.0  # batch norm: 8 x 16 x 16 elements at the 16-side price
          + 8 * 16 * 16 * 1.0  # ReLU
          + 8 * 8 * 8 * 9 * 2.0  # max pool: its output's elements times its 3x3 window
          + 8 * 8 * 8 * 3.0)  # global pool: its input's elements; the convolution, flatten and linear: unpriced
    assert priced_ms_per_sample(desc, prices_key(table)) == pytest.approx(ns * 1e-6)
    assert priced_ms_per_sample(desc, ()) == 0.0
    # the nearest side measured, on a log scale: a 16x16 map with the 8 and 32 sides' prices alone reads the 8's
    # (a log2 distance of 1 to each: the smaller side)
    coarse = dict(table, batchnorm2d={8: 8.0, 32: 32.0})
    assert priced_ms_per_sample(desc, prices_key(coarse)) == pytest.approx((ns - 8 * 16 * 16 * 8.0) * 1e-6)
    # the features: per sample, times the batch size; a column of zeros where no prices were measured
    nf = network_features(desc, StepRuntime().with_op_prices(table))
    F = feature_matrix(nf, [1, 4])
    assert F[:, FEATURE_NAMES.index("priced_ops_ms")] == pytest.approx([ns * 1e-6, 4 * ns * 1e-6])
    assert not feature_matrix(network_features(desc), [4])[0, FEATURE_NAMES.index("priced_ops_ms")]


def test_the_prices_round_trip_through_a_fingerprints_metadata():
    table = {"relu": {1: 0.5, 32: 1.25}, "add": {1: 2.0}}
    runtime = StepRuntime().with_op_prices(table)
    meta = json.loads(json.dumps(runtime.metadata()))
    assert meta["op_prices"] == {"add": {"1": 2.0}, "relu": {"1": 0.5, "32": 1.25}}
    assert StepRuntime.from_metadata(meta) == runtime
    assert StepRuntime.from_metadata({}).op_prices == () and StepRuntime().metadata()["op_prices"] is None


def test_a_broken_prices_file_is_one_line_naming_it(tmp_path):
    assert load_op_prices(tmp_path / "op_prices.json") is None  # none measured
    bad = tmp_path / "op_prices.json"
    for text, why in (("{", "Expecting"), ('{"ops": {}}', "no 'ops' table"),
                      ('{"ops": {"relu": {"2": -1}}}', "finite and >= 0"), ('{"ops": {"relu": [1]}}', "map side"),
                      ('{"ops": {"relu": {"0": 1.5}}}', "sides of 1 or more")):
        bad.write_text(text)
        with pytest.raises(UserError, match=why) as err:
            load_op_prices(bad)
        assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_the_runner_prices_the_ops_once_and_again_for_other_threads(tmp_path):
    """After its sweep a CPU plan with ``op_prices_output`` measures the prices in a fresh process where the file holds
    none current: here a table of another thread count (2), current otherwise; a rerun finds the new one current and
    leaves the file. (A file not there at all is measured by the SSH device of tests/test_remote.py.) The plan has
    no network: a measurement would start a fresh torch for nothing the prices depend on, and a second table measured
    at 2 threads costs several times the first's CPU on a busy machine."""
    from perf4sight.profiling.runner import _prices_current, torch_version

    plan = TestPlan(device="here", networks=[], batch_sizes=[2], threads=1, timeout_s=120,
                    op_prices_output="op_prices.json")
    plan_path = save_plan(plan, tmp_path / "plan.json")
    prices = tmp_path / "op_prices.json"
    prices.write_text(json.dumps({"format_version": 1, "threads": 2, "torch_version": torch_version(),
                                  "ops": {op: {"1": 1.0} for op in PRICED_OPS}}))
    assert _prices_current(prices, TestPlan(**{**plan.to_dict(), "threads": 2})) and not _prices_current(prices, plan)
    events: list[dict] = []
    run_plan(plan_path, events.append)
    assert [e.get("state") for e in events if e["event"] == "op_prices"] == ["measuring", "done"]
    data = json.loads(prices.read_text())
    assert data["threads"] == 1 and set(data["ops"]) == set(PRICED_OPS)
    assert data["ops"]["relu"] != {"1": 1.0} and sorted(data["ops"]["relu"], key=int) == [str(s) for s in SIDES]
    stamp = prices.stat().st_mtime_ns
    again: list[dict] = []
    run_plan(plan_path, again.append)
    assert not [e for e in again if e["event"] == "op_prices"] and prices.stat().st_mtime_ns == stamp


def test_a_plan_without_an_output_prices_nothing(tmp_path):
    """No ``op_prices_output``: the runner prices nothing (no network: whether it prices does not depend on them)."""
    plan_path = tmp_path / "plan.json"
    save_plan(TestPlan(device="here", networks=[], batch_sizes=[2], threads=1, timeout_s=120), plan_path)
    events: list[dict] = []
    run_plan(plan_path, events.append)
    assert events[-1]["event"] == "done" and not [e for e in events if e["event"] == "op_prices"]
    assert not list(Path(tmp_path).glob("op_prices*"))


def test_only_a_cpu_device_that_asks_prices_its_ops(tmp_path):
    """``[profile] op_prices`` is off by default; on, a cpu device's plan names the file, a GPU's does not."""
    from perf4sight.config import load_config
    from perf4sight.profiling.local import make_plan

    net = save_description(describe(small(), SHAPE, name="small"), tmp_path / "small.json")
    config = tmp_path / "config.toml"
    config.write_text('[devices.here]\nbackend = "cpu"\n[devices.gpu]\nbackend = "nvml"\n')
    assert make_plan(load_config(config), "here", [net]).op_prices_output == ""
    config.write_text('[profile]\nop_prices = true\n' + config.read_text())
    cfg = load_config(config)
    assert make_plan(cfg, "here", [net]).op_prices_output == "op_prices.json"
    assert make_plan(cfg, "gpu", [net]).op_prices_output == ""


#: The ops measured from 2026-11-29, each with the op a table measured before prices it as.
NEW_OPS = {"elu": "sigmoid", "softplus": "sigmoid", "mish": "silu", "softmax": "sigmoid",
           "instancenorm": "batchnorm2d", "groupnorm": "batchnorm2d", "pad": "relu", "pad_reflect": "relu",
           "pad_replicate": "relu", "pixel_shuffle": "relu", "pixel_unshuffle": "relu",
           "pad_circular": "relu"}  # measured from 2026-11-30; a table of 2026-11-29 prices it as a reflection


def every_new_op() -> nn.Module:
    """A reflection pad, an instance norm, a zero pad, a pixel shuffle (an ESPCN's upsampling), a replication pad, a
    circular pad, an unshuffle, a softmax over the channels, a group norm, elu, softplus and mish, between two
    convolutions."""
    return nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(3, 8, 3), nn.InstanceNorm2d(8), nn.ReLU(), nn.ZeroPad2d(1),
                         nn.Conv2d(8, 12, 3), nn.PixelShuffle(2), nn.ReplicationPad2d(1), nn.CircularPad2d(1),
                         nn.PixelUnshuffle(2),
                         nn.Softmax(1), nn.GroupNorm(4, 12), nn.ELU(), nn.Softplus(), nn.Mish())


def test_the_ops_added_later_are_measured_each_from_the_side_it_runs_at():
    """Pads (by mode), pixel shuffles, softmax, instance and group norms, elu, softplus and mish are measured on the
    device, each at the sides it can run at (an instance norm not on 1x1 maps, a reflection not of a 1-pixel side)."""
    assert set(NEW_OPS) <= set(PRICED_OPS)
    data = measure_prices(threads=1, ops=list(NEW_OPS))
    table = check_prices(json.loads(json.dumps(data)), "measured")
    assert set(table) == set(NEW_OPS) and data["unmeasured"] == []
    for op, by_side in table.items():
        assert sorted(by_side) == [s for s in SIDES if s >= MIN_SIDE.get(op, 1)], op
        assert all(math.isfinite(v) and v >= 0 for v in by_side.values()) and max(by_side.values()) > 0, op


def test_an_op_this_torch_lacks_is_left_unmeasured_and_the_others_are_measured(monkeypatch):
    """A device's older torch (``nn.Mish`` came in 1.9, ``F.pixel_unshuffle`` in 1.8) measures what it has."""
    import torch.nn.functional as F
    monkeypatch.delattr(nn, "Mish")
    monkeypatch.delattr(F, "pixel_unshuffle")
    data = measure_prices(threads=1, ops=["relu", "mish", "pixel_unshuffle"])
    assert set(data["ops"]) == {"relu"} and data["unmeasured"] == ["mish", "pixel_unshuffle"]


def test_the_ops_added_later_take_their_own_price_and_an_older_tables_borrowed_one():
    desc = describe(every_new_op(), SHAPE, name="every_new_op")
    priced = [n for n in desc.nodes if n.op not in ("input", "conv2d", "relu")]
    own = {op: i + 2.0 for i, op in enumerate(NEW_OPS)}  # a price per op, the same at every side
    old = {"relu": 1.0, "sigmoid": 0.5, "silu": 0.25, "batchnorm2d": 0.125}  # a table measured before 2026-11-29
    key = {n.name: n.op if n.op != "pad" or n.attrs["mode"] == "constant" else "pad_" + n.attrs["mode"]
           for n in priced}
    assert sorted(key.values()) == sorted(NEW_OPS)  # one node of each
    relu_ns = 8 * 16 * 16 * 1.0  # the ReLU after the instance norm

    def ms(table: dict) -> float:
        return priced_ms_per_sample(desc, prices_key({op: {s: v for s in SIDES} for op, v in table.items()}))

    elements = {n.name: math.prod(n.output_shape) for n in priced}
    assert ms({**old, **own}) == pytest.approx(sum(elements[n] * own[key[n]] for n in key) * 1e-6 + relu_ns * 1e-6)
    assert ms(old) == pytest.approx(sum(elements[n] * old[NEW_OPS[key[n]]] for n in key) * 1e-6 + relu_ns * 1e-6)
    # a table of a constant pad's price alone (ops measured one by one) prices the other modes as it
    with_pad = ms({**old, "pad": 16.0})
    pads = sum(elements[n] for n in key if key[n].startswith("pad"))
    assert with_pad == pytest.approx(ms(old) + pads * (16.0 - 1.0) * 1e-6)
    # a table of 2026-11-29 (no circular pad) prices a circular pad as a reflection
    dated = {**old, **{op: price for op, price in own.items() if op != "pad_circular"}}
    circular = next(n for n in key if key[n] == "pad_circular")
    assert ms(dated) == pytest.approx(ms({**old, **own}) + elements[circular] * (own["pad_reflect"]
                                                                                 - own["pad_circular"]) * 1e-6)


def test_a_batch_norm_by_its_running_statistics_takes_its_own_price():
    """A batch norm a training model holds in evaluation (``bn.eval()``) took the price of one in training, measured
    with a statistics pass it does not run. The profile measures it apart (``batchnorm2d_eval``, at every side), and
    it is priced at that; a table measured before prices it as a mul; the same network training keeps batch norm's."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    net[1].eval()
    desc = describe(net, SHAPE, name="frozen")
    trained = describe(net.train(), SHAPE, name="trained")
    assert [n.attrs.get("training") for d in (desc, trained) for n in d.nodes if n.op == "batchnorm2d"] == [False, None]
    out = 8 * 16 * 16
    table = {"batchnorm2d": {s: 8.0 for s in SIDES}, "relu": {s: 1.0 for s in SIDES}, "mul": {s: 2.0 for s in SIDES}}
    own = dict(table, batchnorm2d_eval={s: float(s) for s in SIDES})  # a price that names its side
    assert priced_ms_per_sample(desc, prices_key(own)) == pytest.approx(out * (16.0 + 1.0) * 1e-6)
    assert priced_ms_per_sample(desc, prices_key(table)) == pytest.approx(out * (2.0 + 1.0) * 1e-6)
    assert priced_ms_per_sample(trained, prices_key(own)) == pytest.approx(out * (8.0 + 1.0) * 1e-6)
    assert "batchnorm2d_eval" in PRICED_OPS
    data = measure_prices(threads=1, ops=["batchnorm2d_eval"])
    assert sorted(check_prices(data, "measured")["batchnorm2d_eval"]) == list(SIDES) and data["unmeasured"] == []


def test_the_activations_the_profile_does_not_measure_take_a_measured_ops_price():
    """A GLU takes silu's price per element of its input (it reads two an output element), a hardshrink, a
    softshrink and a threshold relu's, a log-sigmoid softplus's (and where the table lacks it, sigmoid's), each per
    element of its output at its map's side."""
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GLU(1), nn.Hardshrink(), nn.Softshrink(),
                        nn.Threshold(0.1, 0.0), nn.LogSigmoid())
    desc = describe(net, SHAPE, name="acts")
    sides = {s: float(s) for s in SIDES}  # a price that names its side
    table = {"silu": sides, "relu": {s: 1.0 for s in SIDES}, "softplus": {s: 3.0 for s in SIDES},
             "sigmoid": {s: 5.0 for s in SIDES}}
    out = 8 * 16 * 16
    ns = 2 * out * 16.0 + 3 * out * 1.0 + out * 3.0
    assert priced_ms_per_sample(desc, prices_key(table)) == pytest.approx(ns * 1e-6)
    without = {op: v for op, v in table.items() if op != "softplus"}
    assert priced_ms_per_sample(desc, prices_key(without)) == pytest.approx((ns + out * 2.0) * 1e-6)


def test_a_fractional_max_pool_takes_a_max_pools_price_per_window_element():
    """A fractional max pool, which the profile does not measure, takes the max pool's price, each element of its
    output times its window, at its output's side."""
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.FractionalMaxPool2d(3, output_size=(8, 8)))
    desc = describe(net, SHAPE, name="fractional")
    table = {"maxpool2d": {s: float(s) for s in SIDES}, "relu": {s: 1.0 for s in SIDES}}
    assert priced_ms_per_sample(desc, prices_key(table)) == pytest.approx(8 * 8 * 8 * 9 * 8.0 * 1e-6)


def test_a_table_measured_before_the_ops_were_added_is_measured_again_and_priced_until_then(tmp_path):
    """The runner measures a table that lacks an op of PRICED_OPS again (the same threads and torch), and one whose
    torch lacked it stays; the fingerprint stage reads the older table as it is."""
    from perf4sight.profiling.runner import _prices_current, torch_version

    plan = TestPlan(device="here", networks=[], batch_sizes=[2], threads=1, op_prices_output="op_prices.json")
    path = tmp_path / "op_prices.json"
    before = [op for op in PRICED_OPS if op not in NEW_OPS]
    data = {"format_version": 1, "threads": 1, "torch_version": torch_version(),
            "ops": {op: {"1": 1.0, "32": 0.5} for op in before}}
    path.write_text(json.dumps(data))
    assert not _prices_current(path, plan)
    assert set(load_op_prices(path)) == set(before)  # still a table of prices to the fingerprint
    path.write_text(json.dumps(dict(data, unmeasured=list(NEW_OPS))))
    assert _prices_current(path, plan)
    path.write_text(json.dumps(dict(data, ops={op: {"1": 1.0} for op in PRICED_OPS})))
    assert _prices_current(path, plan)


def test_a_mean_over_the_map_is_priced_as_the_global_pool_torch_runs_as_one():
    """torch runs a global average pool (an adaptive one to 1x1) as a mean over the map: ``x.mean((2, 3))`` is priced
    as that pool, per input element, and a variance over the map per input element too (a statistics pass, as a
    batch norm's), not per value it returns."""
    class Reduced(nn.Module):
        def __init__(self, how: str) -> None:
            super().__init__()
            self.conv, self.fc, self.how = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10), how

        def forward(self, x):
            y = self.conv(x)
            return self.fc({"pool": lambda: nn.functional.adaptive_avg_pool2d(y, 1).flatten(1),
                            "mean": lambda: y.mean((2, 3)), "var": lambda: y.var((2, 3))}[self.how]())

    table = prices_key({"adaptiveavgpool2d": {s: 3.0 for s in SIDES}, "batchnorm2d": {s: 5.0 for s in SIDES}})
    priced = {how: priced_ms_per_sample(describe(Reduced(how), SHAPE, how), table) for how in ("pool", "mean", "var")}
    assert priced == pytest.approx({"pool": 8 * 16 * 16 * 3.0e-6, "mean": 8 * 16 * 16 * 3.0e-6,
                                    "var": 8 * 16 * 16 * 5.0e-6})


class _DeadPriced(nn.Module):
    """``small()``'s convolution and head; ``dead``: a batch norm, a ReLU and a max pool of its output whose result
    the forward drops (torch runs them forward alone)."""

    def __init__(self, dead: bool = False) -> None:
        super().__init__()
        self.dead = dead
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.c(x)
        if self.dead:
            self.b(x)
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def test_a_dead_branch_s_ops_are_priced_as_live_ones():
    """On purpose (priced_ops' docstring: measured in steps on this CPU, a dead op adds about what a live one does, far
    more than the profile's forward share of its price): a dead branch's batch norm, ReLU and max pool are priced in
    full, though the walk gives them no backward."""
    from perf4sight.features.walk import untrained_nodes

    table = {"batchnorm2d": {s: 5.0 for s in SIDES}, "relu": {s: 1.0 for s in SIDES},
             "maxpool2d": {s: 2.0 for s in SIDES}, "adaptiveavgpool2d": {s: 3.0 for s in SIDES}}
    runtime = StepRuntime().with_op_prices(table)
    descs = {dead: describe(_DeadPriced(dead), SHAPE, f"dead{dead}") for dead in (False, True)}
    assert len(untrained_nodes(descs[True])) == 3 and not untrained_nodes(descs[False])
    priced = {dead: network_features(d, runtime).per_sample["priced_ops_ms"] for dead, d in descs.items()}
    full = 8 * 16 * 16 * (5.0 + 1.0) + 8 * 8 * 8 * 9 * 2.0  # batch norm, ReLU, the 3x3 pool's output x window
    assert priced[True] - priced[False] == pytest.approx(full * 1e-6)
