"""Every feature value and every predicted figure of a tree's perf4sight, to check a speed change of the features, the
written-down events or the prediction's own work against the code before it to the byte (run by hand, not by
run_all.py: its name starts with an underscore; bench/_same_figures.py covers the replay and the events).

    .venv/bin/python bench/_same_predictions.py dump /path/to/base_clone base.json FP_DIR [FP_DIR ...]
    .venv/bin/python bench/_same_predictions.py dump . new.json FP_DIR [FP_DIR ...]
    .venv/bin/python bench/_same_predictions.py compare base.json new.json

dump: for each fingerprint folder (e.g. the TX2's and bench/h200/fingerprinting/h200, fitted with
``./dev.sh run --config bench/h200/config.toml --stage fingerprint``), each description (the zoo descriptions of
``$SAME_ZOO`` (a folder of them; /tmp/hB_zoo by default, skipped if missing), bench/h100/models, bench/h200/models,
and the first TX2 graph of each family under $TX2_DATA/graphs, where that folder exists) cold (``clear_cache``):
its features as the fingerprint computes them (``per_sample``, ``static``, the saved sizes, the kernel table's
arrays) and its feature rows, then each predicted row (``predict``), at batch sizes 1, 2, 7, 32, 64, every value
as repr; and every row of one ``predict`` of all of them. compare: how many differ, the first few named; exit 1 if any.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

BATCHES = [1, 2, 7, 32, 64]
HERE = Path(__file__).resolve().parent


def _descriptions() -> list[Path]:
    zoo = Path(os.environ.get("SAME_ZOO", "/tmp/hB_zoo"))
    found = sorted(zoo.glob("*.json")) if zoo.is_dir() else []
    for folder in (HERE / "h100" / "models", HERE / "h200" / "models"):
        found += sorted(p for p in folder.rglob("*.json") if not p.name.startswith("manifest"))
    tx2 = Path(os.environ.get("TX2_DATA", "/work/shared/data/tx2-perf4sight")) / "graphs"
    seen: set[str] = set()
    for p in sorted(tx2.glob("*.json")) if tx2.is_dir() else []:
        family = re.sub(r"_\d+$", "", p.stem)
        if family not in seen:
            seen.add(family)
            found.append(p)
    return found


def _arrays(obj: object) -> dict[str, str]:
    """Every numpy array or plain field of a dataclass instance (a kernel table), as repr of its values."""
    out = {}
    for k, v in sorted(vars(obj).items()):
        out[k] = repr(v.tolist()) if hasattr(v, "tolist") else repr(v)
    return out


def dump(code: Path, out: Path, fps: list[Path]) -> None:
    sys.path.insert(0, str(code.resolve()))
    from perf4sight.features.aggregate import FEATURE_NAMES, feature_matrix
    from perf4sight.features.alloc_trace import clear_cache
    from perf4sight.fingerprint.predict import load_fingerprint
    from perf4sight.ir.schema import load_description

    descs = []
    for p in _descriptions():
        try:
            descs.append((p, load_description(p)))
        except Exception as e:  # a TX2 graph in another format: named, left out
            print(f"left out {p}: {type(e).__name__}: {str(e)[:80]}")
    values: dict[str, str] = {}
    for fp_dir in fps:
        fp = load_fingerprint(fp_dir)
        for path, desc in descs:
            key = f"{fp_dir.name}/{path.parent.name}/{path.stem}"
            clear_cache()
            try:
                nf = fp._features(desc)
                fp._simulate_if_needed([nf])
                for k, v in sorted(nf.per_sample.items()):
                    values[f"{key}/per_sample/{k}"] = repr(v)
                for k, v in sorted(nf.static.items()):
                    values[f"{key}/static/{k}"] = repr(v)
                values[f"{key}/saved_sizes"] = repr(nf.saved_sizes.tolist())
                values[f"{key}/batch_saved_sizes"] = repr(nf.batch_saved_sizes.tolist())
                values[f"{key}/unsupported"] = repr(nf.unsupported)
                if nf.kernels is not None:
                    for k, v in _arrays(nf.kernels).items():
                        values[f"{key}/kernels/{k}"] = v
                F = feature_matrix(nf, BATCHES)
                for b, row in zip(BATCHES, F):
                    for name, v in zip(FEATURE_NAMES, row):
                        values[f"{key}/b{b}/feature/{name}"] = repr(float(v))
                clear_cache()
                for row in fp.predict(desc, BATCHES):
                    for k, v in sorted(row.items()):
                        values[f"{key}/b{row.get('batch_size')}/predicted/{k}"] = repr(v)
            except Exception as e:  # the same error before and after is the same figure
                values[f"{key}/error"] = f"{type(e).__name__}: {e}"
        clear_cache()
        try:  # all of them in one call (feature_matrix's rows of many networks)
            rows = fp.predict([d for _, d in descs], BATCHES)
            values[f"{fp_dir.name}/all"] = repr([sorted(r.items()) for r in rows])
        except Exception as e:
            values[f"{fp_dir.name}/all/error"] = f"{type(e).__name__}: {e}"
    out.write_text(json.dumps(values, sort_keys=True))
    import perf4sight
    print(f"{perf4sight.__file__}: {len(descs)} descriptions x {len(fps)} fingerprints: {len(values)} values -> {out}")


def compare(a: Path, b: Path) -> int:
    old, new = json.loads(a.read_text()), json.loads(b.read_text())
    keys = sorted(set(old) | set(new))
    differ = [k for k in keys if old.get(k) != new.get(k)]
    print(f"{len(keys)} compared, {len(differ)} differ {differ[:8]}")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "dump":
        dump(Path(sys.argv[2]), Path(sys.argv[3]), [Path(p) for p in sys.argv[4:]])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit("usage: _same_predictions.py dump TREE OUT.json FP_DIR [FP_DIR ...] | compare A.json B.json")
