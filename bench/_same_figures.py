"""Every allocator-replay figure and every written-down event of a tree's perf4sight, to check a speed change against
the code before it to the byte (run by hand, not by run_all.py: its name starts with an underscore).

    .venv/bin/python bench/_same_figures.py dump /path/to/base_clone base.json
    .venv/bin/python bench/_same_figures.py dump . new.json
    .venv/bin/python bench/_same_figures.py compare base.json new.json

dump: 10 zoo networks x 6 optimiser settings x 3 protocols x batch sizes 1, 2, 7, 16, 33, 64 at 224 and 64 px (MaxViT
at 224 and 448: it takes multiples of 224), the figures as repr; and a sha256 of every event record_runs writes down
(batch sizes 65521 and 7) and of step_events' (setup, body, tail, gradients, parameter bytes) at 224, 160, 64 px (MaxViT
224, 448). compare: how many of each differ, the first few named; exit 1 if any.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

NETS = ["resnet18", "resnet50", "mobilenet_v2", "squeezenet1_0", "densenet121", "convnext_tiny", "vit_b_16",
        "swin_t", "swin_v2_t", "maxvit_t"]
SETTINGS = [{}, {"set_to_none": True}, {"optimizer": "adam"}, {"optimizer": "adamw", "foreach": False},
            {"foreach": True}, {"momentum": 0.0, "weight_decay": 0.0, "set_to_none": True}]
BATCHES = [1, 2, 7, 16, 33, 64]


def _sides(net: str, sides: tuple[int, ...]) -> list[int]:
    return [s for s in sides if (s % 224 == 0) == net.startswith("maxvit") or s == 224]


def dump(code: Path, out: Path) -> None:
    sys.path.insert(0, str(code.resolve()))
    from perf4sight.features.alloc_model import step_events
    from perf4sight.features.alloc_trace import clear_cache, record_runs, simulate
    from perf4sight.features.allocator import REPLAY_PROTOCOLS
    from perf4sight.networks.zoo import describe_zoo

    figures, events = {}, {}
    for net in NETS:
        for side in _sides(net, (224, 64, 448)):
            desc = describe_zoo(net, [3, side, side])
            for k, setting in enumerate(SETTINGS):
                clear_cache()
                trace = simulate(desc, **setting)
                for protocol in REPLAY_PROTOCOLS:
                    for b in BATCHES:
                        figures[f"{side}/{net}/{k}/{protocol}/{b}"] = [repr(x) for x in
                                                                       trace.with_protocol(protocol).replay(b)]
        for side in _sides(net, (224, 160, 64, 448)):
            desc = describe_zoo(net, [3, side, side])
            for k, setting in enumerate(SETTINGS):
                runs = record_runs(desc, (65521, 7), **setting)
                events[f"{side}/{net}/{k}"] = hashlib.sha256(repr(runs).encode()).hexdigest()
            for b in (65521, 7):
                st = step_events(desc, b)
                blob = repr((st.setup, st.body, st.tail, sorted(dict(st.grads).items()), list(st.param_bytes)))
                events[f"{side}/{net}/step_events/{b}"] = hashlib.sha256(blob.encode()).hexdigest()
    out.write_text(json.dumps({"figures": figures, "events": events}, sort_keys=True))
    print(f"{len(figures)} figures, {len(events)} event hashes -> {out}")


def compare(a: Path, b: Path) -> int:
    old, new = json.loads(a.read_text()), json.loads(b.read_text())
    bad = 0
    for part in ("figures", "events"):
        keys = sorted(set(old[part]) | set(new[part]))
        differ = [k for k in keys if old[part].get(k) != new[part].get(k)]
        bad += len(differ)
        print(f"{part}: {len(keys)} compared, {len(differ)} differ {differ[:8]}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "dump":
        dump(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit("usage: _same_figures.py dump TREE OUT.json | compare A.json B.json")
