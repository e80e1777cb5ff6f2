"""The Python API's inputs: batch sizes, descriptions given as files, torch modules at a wrong or another
input shape, and ``max_batch_size`` on every predictor. Bad input is one ``UserError`` line, never a
traceback on stderr."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from perf4sight.config import FingerprintConfig
from perf4sight.errors import UserError
from perf4sight.features.aggregate import features_for
from perf4sight.fingerprint import accuracy_lines, fit_fingerprint, load_fingerprint
from perf4sight.fingerprint.gnn import fit_gnn, load_predictor
from perf4sight.fingerprint.predict import batch_list
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, save_description

SHAPE = [3, 16, 16]  # the training networks' input shape
BATCHES = (1, 4, 16)


def _cnn(width: int, depth: int, in_channels: int = 3) -> nn.Module:
    """A small real CNN: ``depth`` 3x3 convolutions of ``width`` channels, pooled, one linear layer."""
    layers: list[nn.Module] = []
    cin = in_channels
    for _ in range(depth):
        layers += [nn.Conv2d(cin, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
        cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, dict[str, NetworkDescription]]:
    """Trees and a small GNN fitted on 6 real torch CNNs (two families) with step times and memory that
    follow their costs, and an ``oom`` row per network that teaches the capacity."""
    torch.manual_seed(0)
    descs, rows = {}, []
    for family, depth in (("shallow", 1), ("deep", 3)):
        for width in (4, 8, 16):
            name = f"{family}_w{width}"
            descs[name] = describe(_cnn(width, depth), SHAPE, name=name, network=family)
            for b in BATCHES:
                f = features_for(descs[name], b)
                rows.append({"device": "cpu0", "backend": "cpu", "network": name, "family": family, "batch_size": b,
                             "status": "ok", "latency_ms_median": 2.0 + f["flops_total"] / 2e6,
                             "peak_rss_mb": 20.0 + 40.0 * f["mem_analytic_mb"]})
            rows.append({"device": "cpu0", "backend": "cpu", "network": name, "family": family, "batch_size": 4096,
                         "status": "oom"})
    out = tmp_path_factory.mktemp("api") / "cpu0"
    trees = FingerprintConfig(n_estimators=10)
    fit_fingerprint(rows, descs, "cpu0", out, trees)
    fit_gnn(rows, descs, "cpu0", out, seed=0, hidden=8, layers=2, max_epochs=15, patience=15, trees_config=trees)
    return out, descs


def _one_line(exc: pytest.ExceptionInfo) -> str:
    """The error's message, checked to be one line."""
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def _same(a: list[dict], b: list[dict]) -> bool:
    """Equal prediction rows (figures to 1e-6: the GNN batches its graphs in float32)."""
    return len(a) == len(b) and all(x.keys() == y.keys() and all(
        x[k] == (pytest.approx(y[k], rel=1e-6) if isinstance(y[k], float) else y[k]) for k in x)
        for x, y in zip(a, b))


# ---------------------------------------------------------------- batch sizes

def test_batch_list_accepts_ints_numpy_integers_and_whole_floats():
    assert batch_list(8) == [8] and batch_list(np.int64(4)) == [4] and batch_list(8.0) == [8]
    assert batch_list([2, np.int32(3), 4.0]) == [2, 3, 4] and batch_list(np.array([1, 16])) == [1, 16]
    assert batch_list(range(1, 4)) == [1, 2, 3] and batch_list((32,)) == [32]
    assert all(type(b) is int for b in batch_list(np.array([1, 2])))


@pytest.mark.parametrize("bad, expected", [
    ("16", "'16' is a string"),
    (["8", 16], "'8' is a string"),
    (True, "True is a bool"),
    ([4, False], "False is a bool"),
    ([2.7], "2.7 is not a whole number"),
    (float("nan"), "nan is not a whole number"),
    ([0, 4], r"batch sizes must be positive integers, got \[0, 4\]"),  # the CLI's --batch-size 0 message
    (-2, r"must be positive integers, got \[-2\]"),
    ([8, 2**63 - 1], r"batch size 9223372036854775807 is above 1,000,000,000"),
    ([], "no batch sizes given"),
    (None, r"None \(NoneType\) is not an integer"),
    ([[1, 2]], r"\[1, 2\] \(list\) is not an integer"),
    ({8: 1}, r"batch sizes as a dict; give an int or a list of ints"),  # its keys were taken
])
def test_batch_list_rejects_with_one_line(bad, expected):
    with pytest.raises(UserError, match=expected) as exc:
        batch_list(bad)
    assert _one_line(exc).startswith("predict: ")


# ---------------------------------------------------------------- damaged fingerprint files

def test_a_query_of_a_training_family_gets_the_network_splits_band(fitted, tmp_path):
    """A network of a family the training rows had gets the interval calibrated on networks held out with their
    family in training (the network split); the same network under another family name, and a network of other
    layers under a training family's name, get the held-out family's interval. Here the fit's own check held no
    such band (three networks a family, their errors in step with the widths: 67% of a held-out network's rows at
    the widest), so none is stored and the table says so; the band is then written in as a fit that held it would
    store it, and predict applies it."""
    import json
    import shutil
    from dataclasses import replace
    folder, descs = fitted
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["interval"]["log_ratio_quantiles_seen"] == {}
    for target in ("latency", "memory"):
        assert 0 <= meta["accuracy"][target]["interval_seen_coverage_held_out"] < 90
    assert sum("this band too (one of their own, at its widest, covered only" in line
               for line in accuracy_lines(meta)) == 2
    shutil.copytree(folder, tmp_path / "fp")
    _edit_metadata(tmp_path / "fp", lambda m: m["interval"]["log_ratio_quantiles_seen"].update(
        latency=[-0.05, 0.07], memory=[-0.02, 0.03]))
    fp = load_fingerprint(tmp_path / "fp")
    iv = fp.metadata["interval"]
    assert fp.metadata["training_families"] == ["deep", "shallow"]
    structures = fp.metadata["training_structures"]
    assert structures == {"deep": [descs["deep_w4"].structure], "shallow": [descs["shallow_w4"].structure]}
    assert structures["deep"] != structures["shallow"]  # three convolutions, not one: whatever the widths
    impostor = replace(descs["shallow_w8"], network="deep")  # one convolution, named as the deep family
    assert fp.training_family_of([descs["deep_w8"], impostor, descs["shallow_w16"]]) == ["deep", "", "shallow"]
    for ours, stranger, named in zip(fp.predict(descs["deep_w8"], [2, 8]),
                                     fp.predict(replace(descs["deep_w8"], network="another_family"), [2, 8]),
                                     fp.predict(impostor, [2, 8])):
        for target, unit in (("latency", "ms"), ("memory", "mb")):
            seen_lo, seen_hi = iv["log_ratio_quantiles_seen"][target]
            lo, hi = iv["log_ratio_quantiles"][target]
            assert (seen_lo, seen_hi) != (lo, hi)
            value = ours[f"{target}_{unit}"]
            assert ours[f"{target}_{unit}_low"] == pytest.approx(value * np.exp(seen_lo))
            assert ours[f"{target}_{unit}_high"] == pytest.approx(value * np.exp(seen_hi))
            for query in (stranger, named):
                other = query[f"{target}_{unit}"]
                assert query[f"{target}_{unit}_high"] == pytest.approx(other * np.exp(hi))
    assert sum("for a network of a training family: x" in line for line in accuracy_lines(fp.metadata)) == 2


def test_cpu_fingerprint_keeps_the_mean_step_time_form(fitted):
    """Two families are too few to choose a form by: a CPU fingerprint keeps its preferred step-time form, the
    mean of every step-time form, stores each member, and predicts their geometric mean: with their tree
    corrections for a network of a training family, their analytic parts for the same network under a family
    name the training rows did not have."""
    from dataclasses import replace
    from perf4sight.features.aggregate import feature_matrix, network_features
    from perf4sight.fingerprint.select import MEAN_FORM
    from perf4sight.fingerprint.trees import MeanModel
    folder, descs = fitted
    fp = load_fingerprint(folder)
    sel = fp.metadata["accuracy"]["latency"]["selection"]
    assert sel["chosen"] == sel["preferred"] == MEAN_FORM and list(sel["cv_mean_group_mape"]) == [MEAN_FORM]
    model = fp.models["latency"]
    assert isinstance(model, MeanModel) and len(model.members) == len(sel["members"]) >= 2
    assert model.families == ("deep", "shallow")
    out = fp.predict(descs["deep_w8"], [2, 8])
    F = feature_matrix([network_features(descs["deep_w8"], fp.runtime)] * 2, [2, 8])  # under the rows' rules
    members = np.array([m.predict(F) for m in model.members])
    assert members.std(axis=0).min() > 0  # the members disagree: the mean is not one of them
    expected = np.exp(np.log(members).mean(axis=0))
    np.testing.assert_allclose([p["latency_ms"] for p in out], expected, rtol=1e-9)
    stranger = fp.predict(replace(descs["deep_w8"], network="another_family"), [2, 8])
    analytic = np.exp(np.log([np.maximum(m.analytic(F), 1e-9) for m in model.members]).mean(axis=0))
    np.testing.assert_allclose([p["latency_ms"] for p in stranger], analytic, rtol=1e-9)
    assert not np.allclose(analytic, expected)
    impostor = replace(descs["shallow_w8"], network="deep")  # a deep family's name on other layers: no trees
    F = feature_matrix([network_features(impostor, fp.runtime)] * 2, [2, 8])
    analytic = np.exp(np.log([np.maximum(m.analytic(F), 1e-9) for m in model.members]).mean(axis=0))
    np.testing.assert_allclose([p["latency_ms"] for p in fp.predict(impostor, [2, 8])], analytic, rtol=1e-9)
    split = fp.metadata["accuracy"]["latency"]["network_split"]
    assert split["n"] == fp.metadata["accuracy"]["latency"]["overall"]["n"] and split["mape"] > 0
    assert 0 < fp.metadata["accuracy"]["latency"]["network_split_seen"]["n"] <= split["n"]


@pytest.mark.parametrize("damage", [
    lambda f: (f / "models.npz").write_bytes((f / "models.npz").read_bytes()[:1000]),   # truncated
    lambda f: (f / "models.npz").write_bytes(b""),
    lambda f: (f / "metadata.json").write_text("[]"),
    lambda f: _edit_metadata(f, lambda m: m.update(capacity_mb="big")),
    lambda f: _edit_metadata(f, lambda m: _one_model(m["models"]["latency"]).update(terms=["one", "no_such_feature"])),
    lambda f: _edit_metadata(f, lambda m: m["interval"]["log_ratio_quantiles"].update(latency=[0])),
    # read only when a query was made (a crash then), or wrong without a word: caught at load
    lambda f: _edit_metadata(f, lambda m: m.update(training_domain=5)),
    # a training domain's or the input shapes' parts edited: a traceback at the first query (ValueError,
    # TypeError, AttributeError), or notes read from a string's letters (ops) or an interval of a family never seen
    lambda f: _edit_metadata(f, lambda m: m["training_domain"]["ranges"].update(batch_size=[300])),
    lambda f: _edit_metadata(f, lambda m: m["training_domain"]["ranges"].update(params="0..9")),
    lambda f: _edit_metadata(f, lambda m: m["training_domain"].update(ranges=None)),
    lambda f: _edit_metadata(f, lambda m: m["training_domain"]["traits"].update(linear=True)),
    lambda f: _edit_metadata(f, lambda m: m["training_domain"].update(ops="relu")),
    lambda f: _edit_metadata(f, lambda m: m.update(input_shapes="3x16x16")),
    lambda f: _edit_metadata(f, lambda m: m.update(input_shapes=[[3, 16]])),
    lambda f: _edit_metadata(f, lambda m: m.update(capacity_mb=-5)),  # every query 'does not fit'
    lambda f: _edit_metadata(f, lambda m: m.pop("interval")),         # a zero-width band
    lambda f: _edit_metadata(f, lambda m: m["interval"]["log_ratio_quantiles"].update(memory=[0.1, -0.1])),
    # a band's end of inf: "latency_ms_high": Infinity in --json's lines, not JSON
    lambda f: _edit_metadata(f, lambda m: m["interval"]["log_ratio_quantiles"].update(latency=[0, float("inf")])),
    lambda f: _edit_metadata(f, lambda m: m.update(feature_set="perf4sight-graph-v9")),
    lambda f: _edit_metadata(f, lambda m: m.update(input_shape="x")),
    lambda f: _edit_metadata(f, lambda m: m.update(training_structures={"deep": "0123456789ab"})),
    # the accuracy table, which compare and the fingerprint stage read: an overall of null was an AttributeError
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"].update(overall=None)),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["memory"]["overall"].update(mape="12")),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["memory"].update(per_group=[])),
    # loaded without a word, and then: a traceback at the first query (the replay's protocol), a learnt capacity
    # compared with the prediction, a mean of no members (NaN), a term's coefficient dropped or read as another's,
    # trees summed or stopped on an inner node, a band of [0, 0] for a family never seen, trees reading their
    # inputs in another order, an accuracy table that the stage's print ended in a KeyError
    lambda f: _edit_metadata(f, lambda m: m.update(memory_replay="peak")),
    lambda f: _edit_metadata(f, lambda m: m.update(capacity_basis="demand")),
    lambda f: _edit_metadata(f, lambda m: m["models"]["latency"].update(members=[])),
    lambda f: _edit_metadata(f, lambda m: _one_model(m["models"]["memory"]).update(
        terms=_one_model(m["models"]["memory"])["terms"][:-1])),
    lambda f: _edit_metadata(f, lambda m: _one_model(m["models"]["memory"])["correction"].update(combine="median")),
    lambda f: _edit_metadata(f, lambda m: _one_model(m["models"]["memory"])["correction"].update(max_depth=1)),
    lambda f: _edit_metadata(f, lambda m: _one_model(m["models"]["memory"])["correction"].update(max_depth=10**9)),
    lambda f: _edit_metadata(f, lambda m: m["interval"]["log_ratio_quantiles"].pop("memory")),
    lambda f: _edit_metadata(f, lambda m: m["tree_features_by_target"]["memory"].reverse()),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"]["overall"].pop("mape")),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"].pop("column")),
    # the table's other figures and parts, printed with a format or read as objects: a ValueError, AttributeError
    # or TypeError at the fingerprint stage's print of an up-to-date fingerprint (accuracy_lines)
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"].update(interval_seen_coverage_held_out="67")),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["memory"].update(interval_coverage_held_out=[90])),
    lambda f: _edit_metadata(f, lambda m: m["interval"].update(coverage="0.9")),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"].update(forms_per_fold=["a"])),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"]["selection"].update(terms=5)),
    lambda f: _edit_metadata(f, lambda m: m["accuracy"]["latency"]["selection"]["cv_mean_group_mape"].update(x="12")),
])
def test_damaged_fingerprint_is_one_line(fitted, tmp_path, damage):
    import shutil
    folder = tmp_path / "cpu0"
    shutil.copytree(fitted[0], folder)
    damage(folder)
    with pytest.raises(UserError, match="damaged or from an incompatible version") as exc:
        load_fingerprint(folder)
    assert _one_line(exc)


def test_a_fingerprint_stored_before_the_trees_inputs_were_named_per_target_loads(fitted, tmp_path):
    """Trees fitted before ``tree_features_by_target`` (one ``tree_features`` list for both targets, the step time's
    without ``lt_work_per_launch``, appended since) load and predict as they did: the check of the trees' inputs
    refuses only another order."""
    import shutil
    from perf4sight.fingerprint.trees import TREE_FEATURES
    folder, descs = fitted
    before = load_fingerprint(folder).predict(descs["deep_w8"], [2, 8])
    old = tmp_path / "cpu0"
    shutil.copytree(folder, old)
    _edit_metadata(old, lambda m: m.pop("tree_features_by_target"))
    assert load_fingerprint(old).predict(descs["deep_w8"], [2, 8]) == before
    _edit_metadata(old, lambda m: m.update(tree_features_by_target={"latency": list(TREE_FEATURES),
                                                                    "memory": list(TREE_FEATURES)}))
    assert load_fingerprint(old).predict(descs["deep_w8"], [2, 8]) == before


def _coefficients_overflowing(fitted_folder: Path, tmp_path: Path) -> Path:
    """A copy of the fingerprint folder ``fitted_folder`` whose trees' coefficients were edited to 1e308: each a
    finite number, every figure they make inf."""
    import shutil
    folder = tmp_path / "cpu0"
    shutil.copytree(fitted_folder, folder)
    arrays = dict(np.load(folder / "models.npz"))
    for key in [k for k in arrays if k.endswith(".coef")]:
        arrays[key] = np.full_like(arrays[key], 1e308, dtype=float)
    np.savez(folder / "models.npz", **arrays)
    return folder


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's, on the way to inf
def test_coefficients_edited_to_overflow_are_one_line_not_infinity_in_json(fitted, tmp_path):
    """Coefficients edited to 1e308 load (each is a finite number) and made every figure inf: predict --json
    printed ``"latency_ms": Infinity`` (not JSON) with ``"fits": false``. The query is a one-line error now, on
    the trees and on the ensemble whose trees they are."""
    folder = _coefficients_overflowing(fitted[0], tmp_path)
    for predictor in (load_fingerprint(folder), load_predictor(folder, "ensemble")):
        with pytest.raises(UserError, match=r"^predict: deep_w8 at batch size 4: the predictor gave latency_ms "
                                            r"inf.*not finite numbers: its fingerprint's files were edited") as exc:
            predictor.predict(fitted[1]["deep_w8"], [4])
        _one_line(exc)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's exp, on the way to inf
def test_a_band_wider_than_a_float_loads_and_its_query_is_one_line_not_infinity_in_json(fitted, tmp_path):
    """A band's end whose exp overflows (1000) is a finite number, as a real fit's can be (a GNN fitted on 4 rows
    stored one of about 838, whose folder then failed to load for the ensemble that does not read it): the folder
    loads, and a query whose figure it makes inf is a one-line error instead of ``Infinity`` in --json's lines."""
    import shutil
    folder = tmp_path / "cpu0"
    shutil.copytree(fitted[0], folder)
    for bands in ("log_ratio_quantiles", "log_ratio_quantiles_seen"):  # deep_w8's family is a training one
        _edit_metadata(folder, lambda m: m["interval"][bands].update(latency=[-1000, 1000]))
    predictor = load_fingerprint(folder)
    with pytest.raises(UserError, match=r"^predict: deep_w8 at batch size 4: the predictor gave latency_ms_high "
                                        r"inf.*its interval is unbounded") as exc:
        predictor.predict(fitted[1]["deep_w8"], [4])
    _one_line(exc)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy's, on the way to inf
def test_coefficients_edited_to_overflow_are_one_line_for_the_largest_batch_too(fitted, tmp_path):
    """--max-batch-size on coefficients edited to 1e308 answered "none fits" (every demand inf, over any
    capacity), where predict at a batch size gives the one-line error of figures that are not finite: the search
    that finds none gives that error too, on the trees and on the ensemble whose trees they are."""
    assert load_fingerprint(fitted[0]).max_batch_size(fitted[1]["deep_w8"], 64) > 0  # it fits, as fitted
    folder = _coefficients_overflowing(fitted[0], tmp_path)
    for predictor in (load_fingerprint(folder), load_predictor(folder, "ensemble")):
        with pytest.raises(UserError, match=r"^predict: deep_w8 at batch size \d+: the predictor gave .*inf.*not "
                                            r"finite numbers: its fingerprint's files were edited") as exc:
            predictor.max_batch_size(fitted[1]["deep_w8"], 64)
        _one_line(exc)


def test_structure_keys_of_another_recipe_are_not_compared(fitted, tmp_path):
    """A fingerprint whose structure keys were made by another recipe (``structure_version``) tells a training
    family by its name alone, as one fitted before the keys were stored: its keys would match no query's."""
    import shutil
    from dataclasses import replace
    from perf4sight.ir.schema import STRUCTURE_VERSION
    folder, descs = fitted
    impostor = replace(descs["shallow_w8"], network="deep")
    assert load_fingerprint(folder).metadata["structure_version"] == STRUCTURE_VERSION
    assert load_fingerprint(folder).training_family_of([descs["deep_w8"], impostor]) == ["deep", ""]
    for change in (lambda m: m.update(structure_version=STRUCTURE_VERSION + 1), lambda m: m.pop("structure_version")):
        copy = tmp_path / f"cpu{len(list(tmp_path.iterdir()))}"
        shutil.copytree(folder, copy)
        _edit_metadata(copy, change)
        assert load_fingerprint(copy).training_family_of([descs["deep_w8"], impostor]) == ["deep", "deep"]


def _one_model(entry: dict) -> dict:
    """A model's metadata entry, or its first member's where it is a mean form."""
    return entry["members"][0] if "members" in entry else entry


def _edit_metadata(folder: Path, change) -> None:
    import json
    meta = json.loads((folder / "metadata.json").read_text())
    change(meta)
    (folder / "metadata.json").write_text(json.dumps(meta))


# ---------------------------------------------------------------- descriptions

def test_predict_reads_description_files_on_every_predictor(fitted, tmp_path):
    out, descs = fitted
    path = save_description(descs["deep_w8"], tmp_path / "deep_w8.json")
    for kind in ("trees", "gnn", "ensemble"):
        predictor = load_predictor(out, kind)
        direct = predictor.predict([descs["deep_w8"], descs["shallow_w4"]], [2, 8])
        assert _same(predictor.predict(str(path), [2, 8]), direct[:2]), kind
        assert _same(predictor.predict([path, descs["shallow_w4"]], [2, 8]), direct), kind


def test_predict_rejects_what_is_not_a_description(fitted, tmp_path):
    out, descs = fitted
    fp = load_fingerprint(out)
    for bad, expected in ((42, "got int$"), ([descs["deep_w8"], 3.5], r"got float \(item 1\)"),
                          ({"deep_w8": descs["deep_w8"]}, "got dict$"), ([], "no networks given"),
                          (_cnn(4, 1), r"got a torch module \(Sequential\); use predict_module"),
                          (tmp_path / "missing.json", "missing.json: network description file not found"),
                          (tmp_path, "is a folder, not a network description file$"),  # it said "not found"
                          ("resnet18", r"'resnet18' is not a description file; give the description .json file, or "
                                       r"the module to predict_module\(torchvision.models.resnet18\(\)"),
                          # a dataset's variant is no torchvision builder (it suggested torchvision.models.resnet18_0)
                          ("resnet18_0", r"give the description .json file, or the module to "
                                         r"predict_module\(the network's module, input_shape"),
                          ("nets.py:mine", r"'nets.py:mine' names a function in a Python file, which the command "
                                           r"line reads; here call it and give the module to predict_module")):
        with pytest.raises(UserError, match=expected) as exc:
            fp.predict(bad, [8])
        _one_line(exc)
    with pytest.raises(UserError, match="expected a NetworkDescription, a description file path"):
        load_predictor(out, "gnn").predict(object(), 8)


# ---------------------------------------------------------------- torch modules

def test_wrong_length_input_shape_is_one_line_without_stderr(fitted, capfd):
    fp = load_fingerprint(fitted[0])
    for shape in ([64, 64], [3, 0, 32], "3x32x32", [3, 32.0, 32]):
        with pytest.raises(UserError, match=r"net: input shape must be \[C, H, W\], three positive integers") as exc:
            fp.predict_module(_cnn(4, 1), shape, [4], name="net")
        _one_line(exc)
    assert capfd.readouterr().err == ""


def test_forward_failing_at_the_shape_names_model_shape_and_torch_message(capfd):
    gray = _cnn(16, 1, in_channels=1)  # one input channel, described at three
    with pytest.raises(UserError, match=r"^gray: the model's forward fails at input shape \[3, 32, 32\] "
                                        r"\(\[C, H, W\]\) \(its first layer takes 1-channel images: give an input "
                                        r"shape of \[1, H, W\]\): RuntimeError: Given groups=1, weight of size "
                                        r"\[16, 1, 3, 3\].* to have 1 channels") as exc:
        describe(gray, [3, 32, 32], name="gray")
    _one_line(exc)
    assert capfd.readouterr().err == ""  # torch's ShapeProp printed a traceback per attempt before
    assert describe(gray, [1, 32, 32], name="gray").input_shape == [1, 32, 32]  # its own shape describes



class _TwoInputs(nn.Module):
    """A network whose forward takes two images, ``x`` and ``y``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 10)

    def forward(self, x, y):
        return self.fc((self.conv(x) + self.conv(y)).mean((2, 3)))


class _Masked(_TwoInputs):
    """A network whose forward takes an image ``x`` and a keyword-only ``mask``."""

    def forward(self, x, *, mask):  # type: ignore[override]
        return self.fc((self.conv(x) * mask).mean((2, 3)))


def test_a_forward_taking_two_inputs_is_refused_naming_them(fitted, capfd):
    """A forward of two inputs read "the model's forward fails at input shape [3, 16, 16] ([C, H, W]):
    StopIteration" (torch.fx's interpreter ran out of inputs): it names the inputs a description cannot give."""
    fp = load_fingerprint(fitted[0])
    for model, names in ((_TwoInputs(), "x, y"), (_Masked(), "x, mask")):
        with pytest.raises(UserError, match=rf"^two: its forward takes 2 inputs \({names}\); a description is of a "
                                            r"network of one input, an image of \[C, H, W\]") as exc:
            fp.predict_module(model, SHAPE, [4], name="two")
        _one_line(exc)
        assert "StopIteration" not in str(exc.value)
    assert capfd.readouterr().err == ""


class _SplitStem(nn.Module):
    """A 4-channel network whose block takes its map apart (``chunk``, as YOLOv8's C2f does)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.fc = nn.Conv2d(4, 8, 3), nn.Linear(8, 10)

    def forward(self, x):
        a, b = self.stem(x).chunk(2, 1)
        return self.fc(torch.cat([b, a], 1).mean((2, 3)))


def test_a_forward_failing_while_a_split_s_pieces_are_counted_is_the_forward_s_failure(capfd):
    """A network with a split described at another channel count than its own was "cannot trace the module with
    torch.fx (RuntimeError: ...)": the pieces are counted by running the layers before them, and their failure read
    as the trace's."""
    with pytest.raises(UserError, match=r"^split: the model's forward fails at input shape \[3, 24, 40\] "
                                        r"\(\[C, H, W\]\) \(its first layer takes 4-channel images: give an input "
                                        r"shape of \[4, H, W\]\): RuntimeError: Given groups=1") as exc:
        describe(_SplitStem(), [3, 24, 40], name="split")
    _one_line(exc)
    assert capfd.readouterr().err == ""
    assert describe(_SplitStem(), [4, 24, 40], name="split").input_shape == [4, 24, 40]


class _CheckedStem(nn.Module):
    """A 4-channel network that checks its map's shape (``assert y.dim() == 4``, a branch torch.fx cannot trace,
    worked out from shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.fc = nn.Conv2d(4, 8, 3), nn.Linear(8, 10)

    def forward(self, x):
        y = self.stem(x)
        assert y.dim() == 4, "a map"
        return self.fc(y.mean((2, 3)))


def test_a_forward_failing_while_a_condition_is_worked_out_names_torch_s_message_and_the_hint(capfd):
    """A network with a shape check, described at another channel count than its own, failed while the check's value
    was worked out on meta tensors, whose message ('Invalid channel dimensions') names no channels: no hint. The
    failure is torch's own (the layers before the check run as the shapes are propagated), with the hint."""
    with pytest.raises(UserError, match=r"^checked: the model's forward fails at input shape \[3, 24, 40\] "
                                        r"\(\[C, H, W\]\) \(its first layer takes 4-channel images: give an input "
                                        r"shape of \[4, H, W\]\): RuntimeError: Given groups=1") as exc:
        describe(_CheckedStem(), [3, 24, 40], name="checked")
    _one_line(exc)
    assert capfd.readouterr().err == ""
    assert describe(_CheckedStem(), [4, 24, 40], name="checked").input_shape == [4, 24, 40]


def test_a_channel_mismatch_inside_the_network_gets_no_input_shape_hint():
    """The hint is for the first layer alone: a layer deeper that gets the wrong channels is the model's own bug."""
    bad = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(4, 8, 3))
    with pytest.raises(UserError, match=r"^bad: the model's forward fails at input shape \[3, 16, 16\] "
                                        r"\(\[C, H, W\]\): RuntimeError: Given groups=1"):
        describe(bad, [3, 16, 16], name="bad")

def test_predict_module_warns_at_another_input_shape_only(fitted):
    out, descs = fitted
    fp = load_fingerprint(out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at the training shape
        same = fp.predict_module(_cnn(8, 3), (3, 16, 16), 4, name="mine")
    assert [p["network"] for p in same] == ["mine"]
    assert fp.predict_module(_cnn(8, 3), (3, 16, 16), 4)[0]["network"] == "Sequential"  # unnamed: its class
    with pytest.raises(UserError) as exc:  # the name was the returned rows' network as given (the int 5)
        fp.predict_module(_cnn(8, 3), (3, 16, 16), 4, name=5)
    assert _one_line(exc) == ("predict_module: name 5 (int) is not a str; give a str, or None for the "
                              "module's class name")
    # the same layers as deep_w8, of a family of its own (so without the trees of the families seen)
    as_new = dataclasses.replace(descs["deep_w8"], name="mine", network="mine")
    assert same[0]["memory_mb"] == pytest.approx(fp.predict(as_new, 4)[0]["memory_mb"])
    for kind in ("trees", "gnn", "ensemble"):
        with pytest.warns(UserWarning, match=r"mine: described at input shape 3x32x32, but this fingerprint's "
                                             r"training networks were 3x16x16: expect larger errors"):
            load_predictor(out, kind).predict_module(_cnn(8, 3), [3, 32, 32], [4], name="mine")


def test_outside_training_names_a_query_at_another_input_shape_on_every_predictor(fitted, tmp_path, capsys):
    """outside_training said the MACs range and batch sizes alone: a description at another input shape than the
    training networks' got no word (one as small as a training network's at the shape: none at all). It says it
    in the line --stage predict notes; predict itself stays silent (the CLI and compare call it)."""
    from perf4sight import stages
    out, descs = fitted
    small = describe(_cnn(4, 1), [3, 20, 20], name="small", network="shallow")  # inside the MACs range
    line = "small described at another input shape than this fingerprint's training networks (3x16x16)"
    path = save_description(small, tmp_path / "small.json")
    for kind in ("trees", "gnn", "ensemble"):
        fp = load_predictor(out, kind)
        assert fp.outside_training([small, descs["deep_w8"]], [4]) == [line], kind
        assert fp.outside_training(path, 4) == [line], kind  # a description file as well
        assert fp.outside_training(descs["deep_w8"], [4]) == [], kind
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fp.predict(small, 4)
    # a fingerprint stored before the domain and input_shapes were (input_shape alone): the shape's line alone
    import shutil
    older = shutil.copytree(out, tmp_path / "older")
    _edit_metadata(older, lambda m: [m.pop(k) for k in ("training_domain", "input_shapes")])
    assert load_fingerprint(older).outside_training([small], [4, 10**6]) == [line]
    # --stage predict says it once: its shape note, not again among the domain's lines
    stages._shape_note(fp, [small])
    stages._domain_note(fp, [small], [4], shape_noted=True)
    assert " ".join(capsys.readouterr().err.split()).count("described at another input shape") == 1


def test_the_fingerprint_stages_folder_names_its_device_folders(fitted, tmp_path):
    """load_fingerprint("fingerprinting"), the folder above the README's fingerprinting/local, said "no fingerprint
    here (need metadata.json and models.npz; run the fingerprint stage)", as if none had been fitted."""
    import shutil

    out, _ = fitted
    shutil.copytree(out, tmp_path / "fingerprinting" / "cpu0")
    for load in (load_fingerprint, lambda d: load_predictor(d, "trees")):
        with pytest.raises(UserError) as exc:
            load(tmp_path / "fingerprinting")
        folder = tmp_path / "fingerprinting"
        assert _one_line(exc) == (f"{folder}: no fingerprint here, but in its device folders: give one of them, e.g. "
                                  f"{folder / 'cpu0'} (devices: cpu0)")
    with pytest.raises(UserError, match=r"no fingerprint here \(need metadata.json and models.npz; run the"):
        load_fingerprint(tmp_path)  # nothing below either


def test_predict_module_warns_where_batch_1_cannot_train(fitted):
    """--stage predict notes that a batch of one image cannot train a network with a batch norm over a 1x1 map (torch
    refuses it in training: resnet18 at 32x32, whose profile rows at batch 1 are errors); predict_module answered
    batch 1 with a prediction that fits and said nothing."""
    out, _ = fitted
    fp = load_fingerprint(out)
    pooled = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.BatchNorm2d(8), nn.ReLU(),
                           nn.Flatten(), nn.Linear(8, 10))
    with pytest.warns(UserWarning, match=r"^pooled: a training step at batch 1 fails, whatever the memory: a batch "
                                         r"norm over a 1x1 map has one value per channel"):
        rows = fp.predict_module(pooled, SHAPE, [1, 4], name="pooled")
    assert [r["batch_size"] for r in rows] == [1, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # batch 4 trains it; a network without such a norm trains at batch 1
        fp.predict_module(pooled, SHAPE, [4], name="pooled")
        fp.predict_module(_cnn(8, 1), SHAPE, [1], name="plain")


def test_predict_module_says_what_it_does_with_frozen_and_unused_weights(fitted):
    """``--stage predict`` notes a module's frozen weights (which its prediction trains) and the weights no layer of
    its forward reads (left out of it); ``predict_module`` said nothing of either, its figures of a step the module as
    given does not take."""
    fp = load_fingerprint(fitted[0])
    frozen = _cnn(8, 3)
    frozen[0].requires_grad_(False)
    with pytest.warns(UserWarning, match=r"^frozen parameters \(requires_grad False\): mine 224; the prediction "
                                         r"trains the others alone .* the fingerprint learnt from networks trained "
                                         r"whole: expect larger errors"):
        fp.predict_module(frozen, SHAPE, 4, name="mine")
    with pytest.warns(UserWarning, match=r"^parameters that no layer of the forward reads are left out of the "
                                         r"description, and so of the prediction: mine 0.01 M \(0 MiB as fp32\)"):
        fp.predict_module(_Spare(), SHAPE, 4, name="mine")


class _Spare(nn.Module):
    """A CNN with a layer its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.spare = _cnn(8, 3), nn.Linear(100, 100)

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("dtype, named", [(torch.float64, "float64"), (torch.float16, "float16"),
                                          (torch.bfloat16, "bfloat16")])
def test_a_module_of_another_float_type_is_refused_naming_it(fitted, dtype, named):
    """A ``.double()`` model was refused as a forward failing with torch's 'Input type (float) and bias type (double)
    should be the same', naming neither the model's type nor what to do."""
    with pytest.raises(UserError, match=rf"^mine: 0.weight is {named}, and a description is of a float32 training "
                                        r"step, as the profile measures one: give the model in float32 "
                                        r"\(.float\(\)\)$"):
        load_fingerprint(fitted[0]).predict_module(_cnn(8, 3).to(dtype), SHAPE, 4, name="mine")


@pytest.mark.filterwarnings("ignore::UserWarning")  # DataParallel without a GPU
def test_a_wrapped_model_is_refused_naming_where_the_model_is():
    """A model given compiled or in a DataParallel failed in torch.fx's words: 'Module [OptimizedModule] is missing
    the required "forward" function', 'Proxy object cannot be iterated'."""
    for wrapped, words in ((torch.compile(_cnn(8, 3)), r"torch.compile \(OptimizedModule\)"),
                           (nn.DataParallel(_cnn(8, 3)), r"nn.DataParallel \(DataParallel\)")):
        attr = "_orig_mod" if "compile" in words else "module"
        with pytest.raises(UserError, match=rf"^mine: the model is wrapped by {words}; a description is of the model "
                                            rf"itself, its eager training step on one device: give its .{attr}$"):
            describe(wrapped, SHAPE, "mine")


class _FixedBatch(nn.Module):
    """A forward that fixes the batch size (``view(7, -1)``): it runs where the batch's elements divide by 7."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 7, 3, padding=1), nn.Linear(2 * 16 * 16, 10)

    def forward(self, x):
        return self.fc(self.conv(x).view(7, -1))


def test_modules_with_no_training_step_or_a_fixed_batch_say_so(fitted):
    """A module without parameters was predicted (a step whose backward has nothing to compute gradients of: torch
    refuses it); one that fixes its batch size was described (its reshape's per-sample shape read off a batch of 7)
    and then said to fail at shape [65521, 512], with neither the node nor why."""
    fp = load_fingerprint(fitted[0])
    with pytest.raises(UserError, match=r"^pool: has no parameters, so no training step to predict"):
        fp.predict_module(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), [3, 16, 16], 4, name="pool")
    with pytest.raises(UserError, match=r"^fixed: view reshapes the batch of 2 images it was traced with into a "
                                        r"first dimension of 7: it merges the batch into another dimension, or fixes"):
        fp.predict_module(_FixedBatch(), [3, 16, 16], 4, name="fixed")


# ---------------------------------------------------------------- largest batch that fits

def test_a_module_given_to_max_batch_size_or_outside_training_is_told_to_describe_it(fitted):
    """A torch module given to max_batch_size or outside_training was told "predict: ... use predict_module(...)",
    which answers neither; it is told to describe it, on every predictor."""
    out, _ = fitted
    for kind in ("trees", "gnn", "ensemble"):
        fp = load_predictor(out, kind)
        for call, name in ((lambda m: fp.max_batch_size(m), "max_batch_size"),
                           (lambda m: fp.outside_training(m, 4), "outside_training")):
            with pytest.raises(UserError) as exc:
                call(_cnn(4, 1))
            assert _one_line(exc) == (f"{name}: got a torch module (Sequential); give its description: "
                                      "perf4sight.ir.from_torch.describe(module, input_shape, name)"), kind
        with pytest.raises(UserError, match=r"^predict: got a torch module \(Sequential\); use predict_module"):
            fp.predict(_cnn(4, 1), 4)


def test_max_batch_size_on_every_predictor(fitted, tmp_path):
    out, descs = fitted
    path = save_description(descs["shallow_w4"], tmp_path / "shallow_w4.json")
    for kind in ("trees", "gnn", "ensemble"):
        predictor = load_predictor(out, kind)
        assert predictor.capacity_mb is not None, kind
        m = predictor.max_batch_size(path, limit=8192)
        assert 16 <= m < 4096, (kind, m)  # every measured batch size fits; the oom at 4096 bounds it
        assert predictor.predict(descs["shallow_w4"], [m])[0]["fits"], kind
        assert not predictor.predict(descs["shallow_w4"], [m + 1])[0]["fits"], kind
        assert predictor.max_batch_size(descs["shallow_w4"], limit=8) == 8, kind
        for bad in (0, [4, 8], "8"):  # the message names the argument
            with pytest.raises(UserError, match="limit must be one positive integer"):
                predictor.max_batch_size(descs["shallow_w4"], limit=bad)
        with pytest.raises(UserError, match=r"limit 5000000000 is above 1,000,000,000, the largest batch size"):
            predictor.max_batch_size(descs["shallow_w4"], limit=5_000_000_000)  # positive, but too large: said so
        with pytest.raises(UserError, match="give one network, got 2"):
            predictor.max_batch_size([path, path])


def test_least_pruning_on_every_predictor(fitted):
    """``least_pruning`` over real pruned variants of a 16-wide CNN: the level it finds fits and the level below
    does not; min_channels stops the network short of 99%, which lowers the top of the search; a batch no level
    fits has no answer; a step-time budget raises the level."""
    from perf4sight.fingerprint.pruning_search import least_pruning
    from perf4sight.networks.build import Source, prune_source, pruning_plan

    out, _ = fitted
    source = Source("deep_w16", "test", lambda: _cnn(16, 3), "deep")
    made: dict[int, NetworkDescription] = {}
    plan = pruning_plan(source, SHAPE, "l1-norm", 4, 0)  # traced once, as LevelVariants' levels are

    def variant(level: int) -> NetworkDescription:
        if level not in made:
            (made[level],) = prune_source(source, SHAPE, [level], "l1-norm", 4, 0, plan=plan)
        return made[level]

    for kind in ("trees", "gnn", "ensemble"):
        fp = load_predictor(out, kind)
        batch = fp.max_batch_size(variant(0), limit=8192) + 1  # the unpruned network does not fit
        found = least_pruning(fp, variant, batch)
        assert found.level is not None and 0 < found.level < 99 and found.prediction["fits"], kind
        assert found.variant is made[found.level] and found.prediction["batch_size"] == batch
        assert not fp.predict(variant(found.level - 1), [batch])[0]["fits"], kind
        assert max(found.tried) < 99, (kind, found.tried)  # 4 channels: at most ~94%, the top of the search
        assert set(found.tried) >= set(range(found.level + 1)) and not any(  # every level below asked: none met
            found.tried[level] for level in range(found.level)), (kind, found.tried)
        assert least_pruning(fp, variant, 10 ** 6).level is None  # a million images fit at no level
        budget = fp.predict(variant(found.level), [batch])[0]["latency_ms"] * 0.8
        faster = least_pruning(fp, variant, batch, max_latency_ms=budget)
        assert faster.level > found.level and faster.prediction["latency_ms"] <= budget, kind
    for bad in ("5", 0, -1.0, True):  # a TypeError at the first comparison before
        with pytest.raises(UserError, match=r"least_pruning: max_latency_ms must be a positive number"):
            least_pruning(fp, variant, batch, max_latency_ms=bad)
    assert least_pruning(fp, variant, batch, max_latency_ms=np.float32(budget)).level == faster.level  # numpy's


def test_least_pruning_given_a_description_for_its_variant_function_is_one_line(fitted):
    """A description (or its file) given where least_pruning takes a function of the level stopped with a traceback,
    "TypeError: 'str' object is not callable"."""
    from perf4sight.fingerprint.pruning_search import least_pruning

    out, descs = fitted
    fp = load_fingerprint(out)
    for given, kind in ((descs["deep_w8"], "NetworkDescription"), ("deep_w8.json", "str")):
        with pytest.raises(UserError) as exc:
            least_pruning(fp, given, 4)
        assert _one_line(exc).startswith("least_pruning: variant must be a function of the pruning level (a whole "
                                         "percent) returning the network's description at that level, e.g. lambda ")
        assert _one_line(exc).endswith(f"; got {kind}")


def test_least_pruning_of_a_device_of_unknown_capacity_needs_a_step_time_budget(fitted):
    """With no capacity and no budget nothing was asked of the predictions, and least_pruning answered level 0 (the
    network unpruned) as the least level that fits; the command line refuses that question, and so does the API."""
    from perf4sight.fingerprint.pruning_search import least_pruning

    out, descs = fitted
    for kind in ("trees", "gnn", "ensemble"):
        fp = load_predictor(out, kind)
        for part in (fp, getattr(fp, "trees", None), getattr(fp, "gnn", None)):  # an ensemble's predictors too
            if part is not None:
                part.capacity_mb = None  # as fitted without an out-of-memory row or a memory limit
        with pytest.raises(UserError, match=r"^least_pruning: the device's memory capacity is unknown, so no level "
                                            r"can be found that fits; give max_latency_ms to search for a step-time "
                                            r"budget alone$"):
            least_pruning(fp, lambda level: descs["deep_w16"], 64)
        budget = fp.predict(descs["deep_w16"], [64])[0]["latency_ms"] * 2
        assert least_pruning(fp, lambda level: descs["deep_w16"], 64, max_latency_ms=budget).level == 0


def test_the_configs_own_network_wins_a_zoo_network_of_its_name(tmp_path):
    """A ``[networks]`` description file of resnet18 with 100 classes, the zoo listing none: a level asked for by name
    (``resnet18_l30``) and the name itself are that network, pruned as the networks stage prunes it, not torchvision's
    resnet18 with the config's 10 classes."""
    import torchvision

    from perf4sight.config import load_config
    from perf4sight.dataset import resolve_networks
    from perf4sight.ir.schema import load_description
    from perf4sight.networks.build import make_networks
    from perf4sight.networks.on_request import pruned_on_request

    shape = [3, 32, 32]
    (tmp_path / "extra").mkdir()
    save_description(describe(torchvision.models.resnet18(num_classes=100), shape, "resnet18"),
                     tmp_path / "extra" / "resnet18_100.json")
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ndescription_files = ["extra/resnet18_100.json"]\ninput_shape = [3, 32, 32]\n'
        'num_classes = 10\n[networks.pruning]\nlevels = [0, 30]\n[networks.generator]\ncount = 0\n')
    cfg = load_config(tmp_path / "config.toml")
    make_networks(cfg)
    made = load_description(tmp_path / "models" / "pruned" / "l1-norm" / "resnet18_l30.json")
    asked = pruned_on_request(cfg, "resnet18_l30", shape)
    assert asked.to_json() == made.to_json() and asked.num_classes == 100
    (own,) = resolve_networks(cfg, ["resnet18"], shape)
    assert own.num_classes == 100 and own.params == load_description(
        tmp_path / "models" / "pruned" / "l1-norm" / "resnet18_l0.json").params


class _UpsamplingNet(nn.Module):
    """A U-Net's shape at 16x16: a convolution down, a transposed convolution back up, the skip concatenated, then a
    classifier (the fitted predictors' networks are classifiers)."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.skip = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Conv2d(3, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.head(torch.cat([self.skip(x), self.up(torch.relu(self.down(x)))], 1))


def test_a_module_with_a_transposed_convolution_is_predicted(fitted):
    """A module with a ConvTranspose2d was refused ("no description op"); each predictor predicts its step, its
    transposed convolution costed as a convolution of its MACs (its cost above a module without it)."""
    out, _ = fitted
    without = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 10))
    for kind in ("trees", "gnn", "ensemble"):
        predictor = load_predictor(out, kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a kind of layer the training networks lacked
            got = predictor.predict_module(_UpsamplingNet(), SHAPE, [4], name="unet")[0]
            base = predictor.predict_module(without, SHAPE, [4], name="plain")[0]
        assert got["network"] == "unet" and 0 < got["memory_mb"] and 0 < got["latency_ms"], got
        assert got["memory_mb"] >= base["memory_mb"]


def test_predict_says_why_an_ensembles_memory_under_the_capacity_may_not_fit(fitted, capsys):
    """The ensemble's 'fits' is where the trees and the GNN each fit, against their own capacities, while its memory
    is their geometric mean: under a configured limit a row showed memory under "fits: under N MiB" and 'no', without
    a word (the note said so only of a capacity held against the trees' analytic demand)."""
    from perf4sight.stages import _capacity_note

    folder, descs = fitted
    ens = load_predictor(folder, "ensemble")
    trees, gnn = ens.trees.predict(descs["deep_w8"], 16)[0], ens.gnn.predict(descs["deep_w8"], 16)[0]
    high, low = max(trees["memory_mb"], gnn["memory_mb"]), min(trees["memory_mb"], gnn["memory_mb"])
    limit = (high + (high * low) ** 0.5) / 2  # under the higher one, over their geometric mean
    for part in (ens.trees, ens.gnn):  # as a configured limit: each compares it with the memory it predicts
        part.capacity_mb, part.capacity_basis = limit, "prediction"
    ens.capacity_mb, ens.capacity_basis = limit, "prediction"
    (row,) = ens.predict(descs["deep_w8"], 16)
    assert row["memory_mb"] < limit and row["fits"] is False
    capsys.readouterr()
    _capacity_note(ens, [row])
    assert " ".join(capsys.readouterr().err.split()) == (
        "note: the ensemble's 'fits' is where the trees and the GNN each predict the step to fit, each against its "
        "own capacity; the memory shown is their geometric mean, so a row can show memory under the capacity and not "
        "fit")
    _capacity_note(ens.trees, ens.trees.predict(descs["deep_w8"], 16))  # the trees' own rows: nothing to explain
    assert capsys.readouterr().err == ""


def test_the_largest_batch_without_an_allocator_replay_searches_a_large_limit_without_predicting_every_size(fitted):
    """Without an allocator replay (a CPU's memory form) max_batch_size predicted every batch size 1..limit at once:
    1.4 GiB and 10 s at a limit of a million, a MemoryError at ten million (--max-batch-size takes up to a billion).
    It predicts one by one up to 65,536 (far past any training row), bisects above, and finds the same sizes."""
    from perf4sight.fingerprint.predict import EXACT_SCAN

    folder, descs = fitted
    fp = load_fingerprint(folder)
    assert fp.models["memory"].terms and "sim_reserved_mb" not in fp.models["memory"].terms
    small = fp.max_batch_size(descs["deep_w8"])
    assert 1 <= small < 1024 and fp.max_batch_size(descs["deep_w8"], 10 ** 9) == small
    boundary = 3 * EXACT_SCAN + 17  # a capacity first passed above the sizes predicted one by one
    fp.capacity_basis = "prediction"  # as a configured limit: compared with the memory predict gives
    fp.capacity_mb = fp.predict(descs["deep_w8"], [boundary])[0]["memory_mb"]
    found = fp.max_batch_size(descs["deep_w8"], 10 ** 9)
    assert found == boundary and [p["fits"] for p in fp.predict(descs["deep_w8"], [found, found + 1])] == [True, False]
    assert fp.max_batch_size(descs["deep_w8"], boundary - 5) == boundary - 5  # every size up to the limit fits


def test_the_largest_batch_of_a_gnn_checks_the_sizes_below_its_boundary_in_one_prediction(fitted, monkeypatch):
    """The GNN's and the ensemble's max_batch_size bisect, then check the last 6% of sizes below the boundary one by
    one: a boundary at 20,000 (a limit of a million) took 1,250 more predictions and 7 s. They are one prediction
    now, with the same answer."""
    from perf4sight.fingerprint.gnn_predictors import GNNPredictor

    folder, descs = fitted
    gnn = load_predictor(folder, "gnn")
    gnn.capacity_mb = gnn.predict(descs["deep_w8"], [20000])[0]["memory_mb"]
    calls = []
    real = GNNPredictor.predict
    monkeypatch.setattr(GNNPredictor, "predict", lambda self, d, b: calls.append(b) or real(self, d, b))
    found = gnn.max_batch_size(descs["deep_w8"], 10 ** 6)
    assert [p["fits"] for p in real(gnn, descs["deep_w8"], [found, found + 1])] == [True, False]
    assert found == 20000 and len(calls) < 40, len(calls)


def test_the_family_note_says_a_family_never_seen_s_interval_where_no_band_of_its_own_was_stored(fitted, capfd):
    """The fit stores no band of a family seen where none held its coverage (this fixture's, the test above): a
    query of a training family then gets a family never seen's interval, and predict's note says so instead of
    'the interval of such networks'."""
    from perf4sight.stages import _family_note
    folder, descs = fitted
    fp = load_fingerprint(folder)
    assert fp.seen_band_targets == ()
    _family_note(fp, [descs["deep_w8"]])
    err = " ".join(capfd.readouterr().err.split())
    assert "deep_w8: of a family this fingerprint was trained on: the interval of a family never seen (no band of " \
           "such networks held its coverage)" in err


def test_the_structure_is_read_only_for_a_family_the_fingerprint_was_trained_on(fitted, monkeypatch):
    """training_family_of reads a network's structure key (every layer written as JSON and hashed) only where its
    family is one of the training families: another's answer is "" whatever its layers; the answers as before."""
    from dataclasses import replace
    folder, descs = fitted
    fp = load_fingerprint(folder)
    stranger = replace(descs["deep_w8"], network="another_family")
    impostor = replace(descs["shallow_w8"], network="deep")
    expected = fp.training_family_of([descs["deep_w8"], stranger, impostor])
    read: list[str] = []
    key = NetworkDescription.structure.fget
    monkeypatch.setattr(NetworkDescription, "structure", property(lambda d: read.append(d.family) or key(d)))
    assert fp.training_family_of([descs["deep_w8"], stranger, impostor]) == expected == ["deep", "", ""]
    assert read == ["deep", "deep"]
