"""Fingerprint accuracy on networks it has never seen, against perf4sight's feature set.

For every network family held out in turn, the whole fingerprint pipeline (``fit_fingerprint``:
model choice by grouped CV on the training families, group-conformal interval, capacity learnt
from ``oom`` rows) is fitted on the other families and asked about the held-out one:

- MAPE / RMSPE / share within ±10 % per held-out family, latency and memory; beside it the
  ``perf4sight-conv`` feature set (56 summed conv-layer costs) through ExtraTrees(300) on the same
  folds, and on the Jetson TX2 data perf4sight's published figures;
- coverage of the nominal 90 % interval on the held-out rows;
- out of memory: is the predicted largest batch size right (between the largest batch that ran and
  the smallest that failed), and is ``fits`` right per measured row; and, what ``--prune-to-fit`` answers,
  the least pruning level of the held-out family that fits at each batch size where its unpruned network
  did not (among the family's measured variants: the same level, or the next one up or down);
- random 5-fold splits over rows (from the full fit's metadata);
- where the held-out error comes from (diagnostics, not predictors): the MAPE left after rescaling the
  held-out predictions by the one factor that best fits the whole family (its bias removed), and by one
  factor per network (each pruning level's bias removed): what is left then is scatter along the
  batch sizes and measurement noise;
- speed: description -> prediction per network, and per query in a batch of queries.

Every held-out figure is the mean over the trees' seeds (``--seeds``, default 0 1 2, as perf4sight's
published figures are), with each family's lowest and highest MAPE over the seeds printed beside it:
on four families a per-family figure moves by up to ~0.8 points from the seed alone.

    .venv/bin/python bench/bench_fingerprint.py          # TX2 data (shared/) + profiling_csvs/local if present
    .venv/bin/python bench/bench_fingerprint.py --csv profiling_csvs/local/measurements.csv --models models
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from perf4sight.blas import pin_kernels  # noqa: E402

pin_kernels()  # before numpy loads (and OpenBLAS): the figures reproduce on any x86-64 host
import numpy as np  # noqa: E402

from perf4sight.config import FingerprintConfig  # noqa: E402
from perf4sight.features.aggregate import network_features  # noqa: E402
from perf4sight.features.priced_ops import load_op_prices  # noqa: E402
from perf4sight.features.perf4sight_set import perf4sight_matrix, perf4sight_vectors  # noqa: E402
from perf4sight.fingerprint import fit_fingerprint, load_fingerprint  # noqa: E402
from perf4sight.fingerprint.drift import drift_line, normalise_step_times  # noqa: E402
from perf4sight.fingerprint.evaluate import metrics  # noqa: E402
from perf4sight.fingerprint.fit import LATENCY_COLUMN, memory_column  # noqa: E402
from perf4sight.importers import import_perf4sight  # noqa: E402
from perf4sight.importers.perf4sight_csv import THRASH_RATIO  # noqa: E402
from perf4sight.ir.schema import load_description  # noqa: E402
from perf4sight.profiling.results import (OP_PRICES_JSON, REFERENCES_CSV, batch_size_of, read_rows,  # noqa: E402
                                         results_path)

#: the shared TX2 folder beside the checkout (PERF4SIGHT_TX2_DATA, as for the tests, where it is elsewhere)
TX2 = Path(os.environ.get("PERF4SIGHT_TX2_DATA", ROOT.parent / "shared" / "data" / "tx2-perf4sight"))
#: The project's own cpu measurements (profile stage, default config), evaluated too when present.
LOCAL_CSV = ROOT / "profiling_csvs" / "local" / "measurements.csv"
#: perf4sight (ICCV-W 2021) leave-one-network-out MAPE, percent, on the TX2 data.
REFERENCE = {"memory": {"resnet18": 13.0, "resnet50": 6.2, "mobilenetv2": 6.9, "squeezenet": 12.7},
             "latency": {"resnet18": 13.6, "resnet50": 11.1, "mobilenetv2": 37.8, "squeezenet": 11.6}}
TARGET_MAPE = {"memory": 5.0, "latency": 8.0}
#: The trees' seeds every held-out figure is averaged over (perf4sight's published figures: seeds 0-2).
SEEDS = (0, 1, 2)


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if np.isfinite(x) and x > 0 else None


def load_tx2(data: Path, tmp: Path, keep_thrashing: bool = False) -> tuple[str, list[dict], dict]:
    """Import the TX2 folder into ``tmp``; (device, rows, descriptions). ``keep_thrashing``: a step that thrashed
    stays ``ok`` (the import records it as ``oom``: ``THRASH_RATIO``)."""
    import_perf4sight(data, "tx2", tmp / "prof", tmp / "models", thrash_ratio=0 if keep_thrashing else THRASH_RATIO)
    rows = read_rows(results_path(tmp / "prof", "tx2"))
    descs = {p.stem: load_description(p) for p in (tmp / "models" / "imported" / "tx2").glob("*.json")}
    return "tx2", rows, descs


def load_csv(csv: Path, models: Path) -> tuple[str, list[dict], dict]:
    """A profile stage's measurements CSV and the descriptions under ``models`` (searched recursively)."""
    rows = read_rows(csv)
    if not rows:
        sys.exit(f"no rows in {csv}")
    device = str(rows[0]["device"])
    wanted = {str(r["network"]) for r in rows}
    descs = {}
    for p in sorted(models.rglob("*.json")):
        if p.stem in wanted and p.stem not in descs:
            try:
                descs[p.stem] = load_description(p)
            except Exception:  # noqa: BLE001 - not a description (e.g. plan files)
                continue
    return device, [r for r in rows if str(r.get("device")) == device], descs


def _conv_baseline(rows: list[dict], descs: dict, col: str, fams: list[str], trees: int,
                   seed: int = 0) -> dict[str, dict]:
    """perf4sight-conv features -> ExtraTrees(``trees``, ``seed``) on the raw target, leave one family out."""
    from sklearn.ensemble import ExtraTreesRegressor
    vec = {n: perf4sight_vectors(descs[n]) for n in {r["network"] for r in rows}}
    rs = [r for r in rows if r["status"] == "ok" and _num(r.get(col))]
    X = perf4sight_matrix([vec[r["network"]] for r in rs], [batch_size_of(r) for r in rs])
    y = np.array([_num(r[col]) for r in rs])
    g = np.array([r["family"] for r in rs])
    out = {}
    for fam in fams:
        te = g == fam
        reg = ExtraTreesRegressor(n_estimators=trees, random_state=seed, n_jobs=1).fit(X[~te], y[~te])
        out[fam] = metrics(y[te], reg.predict(X[te]))
    return out


def _oom_checks(fp: Any, test_rows: list[dict], descs: dict) -> tuple[int, ...]:
    """(max-batch right, max-batch asked, fits right, fits asked, max-batch within 10 %, least pruning right,
    least pruning within one level, least pruning asked) on one held-out family. Max-batch right = between the
    largest batch that ran and the smallest larger one that failed; within 10 % = no more than 10 % outside
    that range. Least pruning: per batch size at which the family's unpruned network ran out of memory, the
    least pruning level of its measured variants predicted to fit against the least that ran (:func:`_least_levels`)."""
    right = asked = fit_right = fit_asked = near = 0
    fitted: dict[tuple[int, float], tuple[bool, bool]] = {}  # (batch size, level) -> (ran, predicted to fit)
    by_net: dict[str, list[dict]] = {}
    for r in test_rows:
        if r["status"] in ("ok", "oom"):
            by_net.setdefault(r["network"], []).append(r)
    for net, rs in by_net.items():
        ok = [batch_size_of(r) for r in rs if r["status"] == "ok"]
        bad = [batch_size_of(r) for r in rs if r["status"] == "oom"]
        preds = fp.predict(descs[net], sorted(ok + bad))
        for p in preds:
            if p["fits"] is None:  # no capacity learnt (no out-of-memory row in training): nothing to check
                continue
            fit_asked += 1
            fit_right += p["fits"] == (p["batch_size"] in ok)
            fitted[(p["batch_size"], descs[net].pruning_level)] = (p["batch_size"] in ok, bool(p["fits"]))
        if not ok or fp.capacity_mb is None:
            continue
        lo = max(ok)
        hi = min([b for b in bad if b > lo], default=None)
        m = fp.max_batch_size(descs[net], limit=1024)
        asked += 1
        right += m is not None and m >= lo and (hi is None or m < hi)
        near += m is not None and m >= 0.9 * lo and (hi is None or m < 1.1 * hi)
    return (right, asked, fit_right, fit_asked, near) + _least_levels(fitted)


def _least_levels(fitted: dict[tuple[int, float], tuple[bool, bool]]) -> tuple[int, int, int]:
    """(right, within one level, asked): at each batch size where the family's unpruned variant (level 0) ran out
    of memory, is the least level predicted to fit the least that ran (None = none of the variants)? "Within one
    level": the two are neighbours in the family's sorted levels at that batch size."""
    right = near = asked = 0
    for b in sorted({b for b, _ in fitted}):
        levels = sorted(lvl for bb, lvl in fitted if bb == b)
        if not levels or levels[0] != 0 or fitted[(b, 0)][0]:
            continue  # no unpruned variant measured there, or it ran: no pruning needed
        ran = next((i for i, lvl in enumerate(levels) if fitted[(b, lvl)][0]), len(levels))
        fits = next((i for i, lvl in enumerate(levels) if fitted[(b, lvl)][1]), len(levels))
        asked += 1
        right += ran == fits
        near += abs(ran - fits) <= 1
    return right, near, asked


def _lofo(device: str, rows: list[dict], descs: dict, fams: list[str], cols: dict[str, str], fcfg: Any,
          tmp: Path, op_prices: dict | None = None) -> tuple[dict, dict, dict]:
    """One leave-one-family-out pass with ``fcfg`` (its seed): (metrics, interval coverage, oom checks),
    per target and held-out family. ``op_prices``: the device's measured op prices (None: none)."""
    ours: dict[str, dict] = {t: {} for t in cols}
    coverage: dict[str, dict] = {t: {} for t in cols}
    oom: dict[str, tuple] = {}
    for fam in fams:
        train = [r for r in rows if r["family"] != fam]
        test = [r for r in rows if r["family"] == fam]
        fit_fingerprint(train, descs, device, tmp / fam, fcfg, nested=False, op_prices=op_prices)  # scored below
        fp = load_fingerprint(tmp / fam)
        nets = sorted({r["network"] for r in test})
        pred = {(p["network"], p["batch_size"]): p for n in nets
                for p in fp.predict(descs[n], sorted({batch_size_of(r) for r in test if r["network"] == n}))}
        for t, col in cols.items():
            key = "latency_ms" if t == "latency" else "memory_mb"
            rs = [r for r in test if r["status"] == "ok" and _num(r.get(col))]
            y = np.array([_num(r[col]) for r in rs])
            ps = [pred[(r["network"], batch_size_of(r))] for r in rs]
            ours[t][fam] = metrics(y, np.array([p[key] for p in ps]))
            ours[t][fam].update(_bias_removed(y, np.array([p[key] for p in ps]), np.array([r["network"] for r in rs])))
            inside = [p[f"{key}_low"] <= v <= p[f"{key}_high"] for p, v in zip(ps, y)]
            coverage[t][fam] = 100.0 * float(np.mean(inside)) if inside else float("nan")
        oom[fam] = _oom_checks(fp, test, descs)
    return ours, coverage, oom


def _mean_over_seeds(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Per target and family, each metric averaged over the seeds' runs; ``mape_seed_range`` its (lowest, highest)."""
    out: dict[str, dict] = {}
    for t, per_fam in runs[0].items():
        out[t] = {}
        for fam in per_fam:
            ms = [r[t][fam] for r in runs]
            out[t][fam] = {k: float(np.mean([m[k] for m in ms])) for k in ms[0]}
            out[t][fam]["mape_seed_range"] = (min(m["mape"] for m in ms), max(m["mape"] for m in ms))
    return out


def evaluate(device: str, rows: list[dict], descs: dict, trees: int = 200, baseline_trees: int = 300,
             label: str = "", simulate_memory: bool = True, held_out: list[str] | None = None,
             seeds: tuple[int, ...] = SEEDS, op_prices: dict | None = None) -> dict[str, Any]:
    """Leave-one-family-out evaluation of the pipeline and the perf4sight-conv baseline (see module doc);
    ``op_prices``: the device's measured op prices (``priced_ops.load_op_prices``; None: none);
    ``held_out``: the families to hold out in turn (default all; the others always stay in training);
    ``seeds``: the trees' seeds; every figure of the held-out families is the mean over them (as
    perf4sight's published figures are over seeds 0-2), the MAPE's range over them printed beside it."""
    rows = [r for r in rows if r["network"] in descs and r.get("status") in ("ok", "oom")]
    mem_col = memory_column(rows)
    cols = {"memory": mem_col, "latency": LATENCY_COLUMN}
    # a family with no ok row (out of memory at every batch size) has nothing to score: it stays in training
    fams = sorted(held_out or {r["family"] for r in rows if r["status"] == "ok"})
    fcfg = replace(FingerprintConfig(), n_estimators=trees, simulate_memory=simulate_memory)
    res: dict[str, Any] = {"device": device, "label": label, "families": fams, "columns": cols,
                           "seeds": list(seeds)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [_lofo(device, rows, descs, fams, cols, replace(fcfg, seed=s), Path(tmp) / f"seed{s}", op_prices)
                for s in seeds]
        res["ours"] = _mean_over_seeds([r[0] for r in runs])
        res["coverage"] = {t: {f: float(np.mean([r[1][t][f] for r in runs])) for f in fams} for t in cols}
        res["oom"] = {f: tuple(float(np.mean([r[2][f][i] for r in runs])) for i in range(len(runs[0][2][f])))
                      for f in fams}
        res["ours_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        res["conv"] = _mean_over_seeds([{t: _conv_baseline(rows, descs, col, fams, baseline_trees, s)
                                         for t, col in cols.items()} for s in seeds])
        res["conv_seconds"] = time.perf_counter() - t0
        meta = fit_fingerprint(rows, descs, device, Path(tmp) / "all", fcfg, nested=False,  # the LOFO table: above
                               op_prices=op_prices)
        res["random_split"] = {t: meta["accuracy"][t]["random_split"] for t in cols}
        res["network_split"] = {t: meta["accuracy"][t]["network_split"] for t in cols}
        res["selection"] = {t: meta["accuracy"][t]["selection"]["chosen"] for t in cols}
        res["speed"] = _speed(load_fingerprint(Path(tmp) / "all"), descs)
    res["noise"] = _noise(rows, cols)
    return res


def _bias_removed(y: np.ndarray, pred: np.ndarray, networks: np.ndarray) -> dict[str, float]:
    """MAPE (%) of ``pred`` rescaled by the median of ``y / pred`` over the whole family and, in turn,
    over each network: oracle factors fitted on the held-out rows themselves (diagnostics only)."""
    if not len(y):
        return {"mape_family_bias_removed": float("nan"), "mape_network_bias_removed": float("nan")}
    family = np.median(y / pred) * pred
    per_network = pred.copy()
    for n in set(networks.tolist()):
        m = networks == n
        per_network[m] *= np.median(y[m] / pred[m])
    return {"mape_family_bias_removed": 100 * float(np.mean(np.abs(family / y - 1))),
            "mape_network_bias_removed": 100 * float(np.mean(np.abs(per_network / y - 1)))}


def _speed(fp: Any, descs: dict) -> dict[str, float]:
    """ms per network from a description never seen before (features, the allocator trace when the
    memory model replays one, 4 batch sizes), µs per query in one batched call."""
    from perf4sight.features.alloc_trace import clear_cache

    names = sorted(descs)
    times = []
    for n in names:
        clear_cache()  # cold: nothing traced at fit time may be reused
        t0 = time.perf_counter()
        fp.predict(descs[n], [2, 8, 32, 64])
        times.append(time.perf_counter() - t0)
    feats = [network_features(descs[n], fp.runtime) for n in names]
    bss = list(range(1, 65))
    per_query = []
    clear_cache()
    for _ in ("cold", "warm"):  # cold: networks never traced; warm: the same call again (traces cached)
        t0 = time.perf_counter()
        out = fp.predict(feats, bss)
        per_query.append((time.perf_counter() - t0) / len(out))
    return {"median_ms": 1e3 * float(np.median(times)), "max_ms": 1e3 * float(max(times)),
            "batched_us_per_query": 1e6 * per_query[0], "batched_warm_us_per_query": 1e6 * per_query[1],
            "batched_queries": len(out)}


def _noise(rows: list[dict], cols: dict[str, str]) -> dict[str, float]:
    """Measurement noise: spread of the timed steps inside one configuration (latency_ms_std / median),
    between the fresh processes of one row (``latency_ms_repeat_cv``, when profiled with repeats > 1),
    and the spread between repeated rows of one (network, batch size) where the data has any (%)."""
    out: dict[str, float] = {}
    within = [(_num(r.get("latency_ms_std")) or 0) / _num(r[LATENCY_COLUMN]) for r in rows
              if r["status"] == "ok" and _num(r.get(LATENCY_COLUMN)) and r.get("latency_ms_std") not in (None, "")]
    if within:
        out["latency_step_cv_median_pct"] = 100 * float(np.median(within))
    between = [_num(r.get("latency_ms_repeat_cv")) for r in rows if r["status"] == "ok"]
    between = [v for v in between if v is not None]
    if between:  # rows measured by `[profile] repeats` fresh processes
        out["latency_process_repeat_cv_median_pct"] = float(np.median(between))
    for t, col in cols.items():
        groups: dict[tuple, list[float]] = {}
        for r in rows:
            if r["status"] == "ok" and _num(r.get(col)):
                groups.setdefault((r["network"], r["batch_size"]), []).append(_num(r[col]))
        reps = [np.std(v) / np.mean(v) for v in groups.values() if len(v) > 1]
        if reps:
            out[f"{t}_repeat_cv_median_pct"] = 100 * float(np.median(reps))
    return out


def table(res: dict[str, Any]) -> list[str]:
    """The printed table of one evaluation."""
    fams, lines = res["families"], []
    ref = REFERENCE if res["device"] == "tx2" else {}
    seeds = ", ".join(map(str, res["seeds"]))
    lines.append(f"== {res['label'] or res['device']}: leave one network family out ({len(fams)} families; "
                 f"mean over the trees' seeds {seeds})")
    for t in ("memory", "latency"):
        lines.append(f"\n{t} ({res['columns'][t]}), target MAPE <= {TARGET_MAPE[t]:.0f}% per held-out family")
        lines.append(f"  {'':<36}" + "".join(f"{f[:12]:>13}" for f in fams) + f"{'mean':>8}")
        rowspec = [("MAPE % ours (fingerprint)", res["ours"][t], "mape"),
                   ("RMSPE % ours", res["ours"][t], "rmspe"), ("within ±10 % ours", res["ours"][t], "within10"),
                   ("MAPE % perf4sight-conv + ET300", res["conv"][t], "mape"),
                   ("within ±10 % perf4sight-conv", res["conv"][t], "within10"),
                   ("MAPE % ours, family bias removed *", res["ours"][t], "mape_family_bias_removed"),
                   ("MAPE % ours, network bias removed *", res["ours"][t], "mape_network_bias_removed")]
        if t in ref:
            rowspec.append(("MAPE % perf4sight paper", {f: {"mape": ref[t].get(f, np.nan)} for f in fams}, "mape"))
        for name, d, k in rowspec:
            vals = [d[f][k] for f in fams]
            lines.append(f"  {name:<36}" + "".join(f"{v:>13.1f}" for v in vals) + f"{np.nanmean(vals):>8.1f}")
        ranges = [res["ours"][t][f]["mape_seed_range"] for f in fams]
        lines.append(f"  {'MAPE % ours, lowest-highest seed':<36}" + "".join(f"{f'{lo:.1f}-{hi:.1f}':>13}"
                                                                       for lo, hi in ranges))
        cov = [res["coverage"][t][f] for f in fams]
        per_family = "".join(f"{v:>13.1f}" for v in cov)
        lines.append(f"  {'90% interval coverage %':<36}" + per_family + f"{np.nanmean(cov):>8.1f}")
        rs = res["random_split"][t]
        ns = res["network_split"][t]
        lines.append(f"  random 5-fold split: MAPE {rs['mape']:.1f}%, RMSPE {rs['rmspe']:.1f}%, "
                     f"±10% {rs['within10']:.1f}%; networks held out, 5 folds: MAPE {ns['mape']:.1f}%, "
                     f"±10% {ns['within10']:.1f}%; chosen form (full fit): {res['selection'][t]}")
    lines.append("  * oracle diagnostics: held-out predictions rescaled by the factor that best fits the family "
                 "(or each network) itself")
    oom = [res["oom"][f] for f in fams]
    checked = sum(o[3] for o in oom)  # rows whose `fits` was known (0: no fold learnt a capacity)
    if checked:
        lines.append("\nout of memory, held-out families (mean over the seeds): max batch size right "
                     + ", ".join(f"{f} {o[0]:.3g}/{o[1]:.3g}" for f, o in zip(fams, oom))
                     + f"; within 10 % {sum(o[4] for o in oom):.3g}/{sum(o[1] for o in oom):.3g}"
                     + f"; `fits` right per row {sum(o[2] for o in oom):.5g}/{checked:.5g}"
                     + "; least pruning that fits (batch sizes where the unpruned network did not), right "
                     + ", ".join(f"{f} {o[5]:.3g}/{o[7]:.3g}" for f, o in zip(fams, oom))
                     + f", within one level {sum(o[6] for o in oom):.3g}/{sum(o[7] for o in oom):.3g}")
    else:
        lines.append("\nout of memory: not evaluated (no fold learnt a memory capacity: its training rows had no "
                     "out-of-memory row)")
    sp = res["speed"]
    lines.append(f"speed: description -> 4 predictions median {sp['median_ms']:.2f} ms (max {sp['max_ms']:.2f} ms) "
                 f"per network; batched {sp['batched_us_per_query']:.1f} µs per query cold, "
                 f"{sp['batched_warm_us_per_query']:.1f} µs warm ({sp['batched_queries']} queries)")
    if res["noise"]:
        lines.append("measurement noise: " + ", ".join(f"{k} {v:.1f}" for k, v in res["noise"].items()))
    lines.append(f"(pipeline LOFO {res['ours_seconds']:.0f} s, baseline {res['conv_seconds']:.0f} s)")
    return lines


def figures(res: dict[str, Any]) -> list[dict]:
    """Rows for bench/run_all.py: keys benchmark, metric, value, unit, note."""
    b, out = f"fingerprint-{res['device']}", []
    for t in ("memory", "latency"):
        for f in res["families"]:
            o, c = res["ours"][t][f], res["conv"][t][f]
            note = f"target <= {TARGET_MAPE[t]}%; mean over seeds {res['seeds']}"
            if res["device"] == "tx2":
                note += f"; perf4sight paper {REFERENCE[t].get(f)}%"
            out += [{"benchmark": b, "metric": f"{t}_mape_{f}", "value": round(o["mape"], 2),
                     "unit": "%", "note": note},
                    {"benchmark": b, "metric": f"{t}_within10_{f}", "value": round(o["within10"], 1),
                     "unit": "%", "note": ""},
                    {"benchmark": b, "metric": f"{t}_mape_{f}_perf4sight_conv_et300", "value": round(c["mape"], 2),
                     "unit": "%", "note": "baseline, same folds"},
                    {"benchmark": b, "metric": f"{t}_interval90_coverage_{f}", "value": round(res["coverage"][t][f], 1),
                     "unit": "%", "note": "target >= 85%"}]
        random_split_mape = round(res["random_split"][t]["mape"], 2)
        network_split_mape = round(res["network_split"][t]["mape"], 2)
        out.append({"benchmark": b, "metric": f"{t}_mape_random_split", "value": random_split_mape,
                    "unit": "%", "note": "5-fold over rows"})
        out.append({"benchmark": b, "metric": f"{t}_mape_network_split", "value": network_split_mape,
                    "unit": "%", "note": "whole networks in 5 folds; their families may be in training"})
    oom = list(res["oom"].values())
    checked = sum(o[3] for o in oom)
    if checked:  # else no fold learnt a capacity (no out-of-memory row): nothing was checked
        out.append({"benchmark": b, "metric": "max_batch_right", "value": round(sum(o[0] for o in oom), 1),
                    "unit": "networks", "note": f"of {sum(o[1] for o in oom):.0f} held-out network variants"})
        out.append({"benchmark": b, "metric": "max_batch_within10pct", "value": round(sum(o[4] for o in oom), 1),
                    "unit": "networks", "note": f"of {sum(o[1] for o in oom):.0f}"})
        out.append({"benchmark": b, "metric": "fits_right_pct", "unit": "%", "note": "per measured row (ok/oom)",
                    "value": round(100 * sum(o[2] for o in oom) / checked, 1)})
        least = sum(o[7] for o in oom)
        if least:
            out.append({"benchmark": b, "metric": "least_pruning_right_pct", "unit": "%",
                        "value": round(100 * sum(o[5] for o in oom) / least, 1),
                        "note": f"of {least:.0f} (family, batch size) pairs where the unpruned network ran out of "
                                "memory; --prune-to-fit's answer among the family's measured levels"})
            out.append({"benchmark": b, "metric": "least_pruning_within_one_level_pct", "unit": "%",
                        "value": round(100 * sum(o[6] for o in oom) / least, 1), "note": f"of {least:.0f}"})
    out.append({"benchmark": b, "metric": "predict_ms_per_network", "value": round(res["speed"]["median_ms"], 2),
                "unit": "ms", "note": "description -> 4 batch sizes, target < 50 ms"})
    out.append({"benchmark": b, "metric": "predict_us_per_query_batched", "unit": "us",
                "value": round(res["speed"]["batched_us_per_query"], 2), "note": "networks never seen before"})
    out.append({"benchmark": b, "metric": "predict_us_per_query_batched_warm", "unit": "us",
                "value": round(res["speed"]["batched_warm_us_per_query"], 2), "note": "networks already traced"})
    for k, v in res["noise"].items():
        out.append({"benchmark": b, "metric": f"noise_{k}", "value": round(v, 2), "unit": "%", "note": "measurement"})
    return out


@contextmanager
def measured_reserved(rows: list[dict]):
    """An upper bound, not a predictor: while active, the allocator replay's reserved peak is replaced by
    the device's measured ``torch_reserved_peak_mb`` wherever a row has one (the replay stays elsewhere),
    so the fingerprint's memory error shows what a perfect reserved-memory model would leave."""
    import perf4sight.features.alloc_trace as alloc_trace

    measured = {(r["network"], batch_size_of(r)): _num(r.get("torch_reserved_peak_mb")) for r in rows}
    replay = alloc_trace.simulate

    class Measured:
        def __init__(self, desc: Any, *args: Any, **kwargs: Any) -> None:
            self.name, self.trace = desc.name, replay(desc, *args, **kwargs)
            self.protocol, self.relu6_clone = self.trace.protocol, self.trace.relu6_clone

        def with_protocol(self, protocol: str) -> "Measured":
            self.trace, self.protocol = self.trace.with_protocol(protocol), protocol
            return self

        def peaks_mb(self, batch_sizes: Any) -> np.ndarray:
            out = self.trace.peaks_mb(batch_sizes)
            for i, b in enumerate(np.asarray(batch_sizes).reshape(-1)):
                out[i, 0] = measured.get((self.name, int(b))) or out[i, 0]
            return out

    alloc_trace.simulate = Measured
    try:
        yield
    finally:
        alloc_trace.simulate = replay


def run(data: Path = TX2, csv: Path | None = LOCAL_CSV if LOCAL_CSV.is_file() else None,
        models: Path | None = None, trees: int = 200, simulate_memory: bool = True,
        with_measured_reserved: bool = False, seeds: tuple[int, ...] = SEEDS,
        keep_thrashing: bool = False, drift_reference: bool = True, op_prices: bool = True) -> list[dict]:
    """Evaluate on the TX2 data (skipped when absent) and on a CPU profiling CSV (the project's own by
    default, when present); print the tables, return the figures. ``with_measured_reserved``: on the TX2
    data, the evaluation with :func:`measured_reserved` instead; ``keep_thrashing``: see :func:`load_tx2`;
    ``drift_reference``: correct the CSV's step times by the ``references.csv`` beside it, if there is one;
    ``op_prices``: fit the CSV's rows with the op prices beside it (``op_prices.json``), if there are some."""
    out: list[dict] = []
    for res in _evaluations(data, csv, models, trees, simulate_memory, with_measured_reserved, seeds,
                            keep_thrashing, drift_reference, op_prices):
        print("\n".join(table(res)), flush=True)
        out += figures(res)
    return out


def _evaluations(data: Path, csv: Path | None, models: Path | None, trees: int, simulate_memory: bool,
                 with_measured_reserved: bool = False, seeds: tuple[int, ...] = SEEDS, keep_thrashing: bool = False,
                 drift_reference: bool = True, op_prices: bool = True):
    if (data / "graphs").is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            device, rows, descs = load_tx2(data, Path(tmp), keep_thrashing)
            if with_measured_reserved:
                with measured_reserved(rows):
                    yield evaluate(device, rows, descs, trees=trees, simulate_memory=True, seeds=seeds,
                                   label="Jetson TX2, MEASURED reserved peak in place of the replay's (upper bound)")
                return
            yield evaluate(device, rows, descs, trees=trees, label="Jetson TX2 (perf4sight data)",
                           simulate_memory=simulate_memory, seeds=seeds)
    else:
        print(f"TX2 data not found at {data} (--data DIR, or PERF4SIGHT_TX2_DATA): skipped")
    if csv is not None:
        device, rows, descs = load_csv(csv, models or ROOT / "models")
        if len({r["family"] for r in rows if r["network"] in descs}) < 2:
            print(f"{csv}: fewer than 2 network families with descriptions: skipped")
            return
        label = f"{device} ({csv.name})"
        refs = csv.parent / REFERENCES_CSV  # the profile stage's drift reference ([profile] reference_every)
        if drift_reference and refs.is_file():
            rows, drift = normalise_step_times(rows, read_rows(refs), LATENCY_COLUMN)
            print(drift_line(drift))
            label += ", step times corrected by its drift reference" if drift["applied"] else ""
        prices = load_op_prices(csv.parent / OP_PRICES_JSON) if op_prices else None  # a CPU profile measures them
        label += ", with its op prices" if prices else ""
        yield evaluate(device, rows, descs, trees=trees, label=label, simulate_memory=simulate_memory, seeds=seeds,
                       op_prices=prices)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=TX2, help="perf4sight TX2 folder")
    ap.add_argument("--csv", type=Path, default=LOCAL_CSV if LOCAL_CSV.is_file() else None,
                    help=f"a profile stage's measurements.csv (default {LOCAL_CSV.relative_to(ROOT)} when present)")
    ap.add_argument("--models", type=Path, help="models dir holding those networks' descriptions")
    ap.add_argument("--trees", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                    help="the trees' seeds the held-out figures are averaged over (default: %(default)s)")
    ap.add_argument("--no-tx2", action="store_true", help="only the --csv data")
    ap.add_argument("--no-simulate-memory", action="store_true",
                    help="fingerprints without the caching-allocator replay ([fingerprint] simulate_memory = false)")
    ap.add_argument("--measured-reserved", action="store_true",
                    help="TX2 only: the device's measured reserved peak in place of the replay's (what a perfect "
                         "reserved-memory model would leave; not a predictor)")
    ap.add_argument("--keep-thrashing", action="store_true",
                    help="TX2: keep a step that thrashed as ok (the import records it as oom: THRASH_RATIO)")
    ap.add_argument("--no-op-prices", action="store_true",
                    help="--csv: fit without the op prices (op_prices.json) beside it, though there are some")
    ap.add_argument("--no-drift-reference", action="store_true",
                    help="--csv: the step times as measured, though a references.csv lies beside it")
    args = ap.parse_args()
    run(Path("/nonexistent") if args.no_tx2 else args.data, None if args.measured_reserved else args.csv, args.models,
        args.trees, simulate_memory=not args.no_simulate_memory, with_measured_reserved=args.measured_reserved,
        seeds=tuple(args.seeds), keep_thrashing=args.keep_thrashing, drift_reference=not args.no_drift_reference,
        op_prices=not args.no_op_prices)


if __name__ == "__main__":
    main()
