"""Step times corrected for a device's drift during a sweep, by its drift reference.

A device's speed can drift while a sweep measures network after network (a CPU VM shared with other
guests, a Jetson heating up and clocking down), and a drift that lasts a few minutes becomes a bias of the
networks measured meanwhile. With ``[profile] reference_every`` the runner measures one fixed configuration
again and again through the sweep (``references.csv`` beside the measurements). Here each ``ok`` row's step
time is multiplied by ``median(reference) / reference(t)``, the reference interpolated linearly in time at
the row's ``timestamp``: the step time the device would have shown at its median speed. Rows outside the
span of the references (measured before the first or after the last) are left as measured; a row measured
between two sweeps that took references is corrected by the line between the last reference of the one and
the first of the other. The CSV keeps the raw figures; only the rows handed to the fit are corrected.
"""
from __future__ import annotations

import statistics
from collections import Counter
from datetime import datetime
from typing import Any

import numpy as np

from perf4sight.profiling.results import batch_size_of, number
from perf4sight.wording import plural

__all__ = ["normalise_step_times", "drift_line", "MIN_REFERENCES"]

#: References a correction needs: two bound a span to interpolate in.
MIN_REFERENCES = 2


def _seconds(stamp: Any) -> float | None:
    """An ISO 8601 ``timestamp`` cell as POSIX seconds, None if it is not one."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


def _configuration(row: dict) -> tuple[str, ...]:
    return (str(row.get("network")), str(batch_size_of(row)), str(row.get("input_shape")),
            str(row.get("description_sha") or ""))


def normalise_step_times(rows: list[dict], references: list[dict], column: str
                         ) -> tuple[list[dict], dict[str, Any]]:
    """(``rows`` with the step time ``column`` of each ``ok`` row inside the references' span divided by the
    drift, a summary for the fingerprint's metadata). ``references``: the device's ``references.csv`` rows; the
    configuration measured most often is the reference (others are passed over). With fewer than
    :data:`MIN_REFERENCES` usable ones the rows come back unchanged and the summary says why (``applied``
    false). Times in ms; ``cv_pct``: the reference's coefficient of variation over the sweep, %."""
    timed = [(t, r) for r in references if r.get("status") == "ok" and (number(r.get(column)) or 0) > 0
             and (t := _seconds(r.get("timestamp"))) is not None]  # each stamp parsed once
    if not timed:
        return rows, {"applied": False, "reason": f"no ok reference measurement among references.csv's "
                                                  f"{plural(len(references), 'row')}"}
    config, _ = Counter(_configuration(r) for _, r in timed).most_common(1)[0]
    timed = sorted(((t, r) for t, r in timed if _configuration(r) == config), key=lambda tr: tr[0])
    if len(timed) < MIN_REFERENCES:
        return rows, {"applied": False, "reason": f"{len(timed)} ok reference measurement, "
                                                  f"{MIN_REFERENCES} or more needed"}
    t_ref = np.array([t for t, _ in timed])
    v_ref = np.array([number(r[column]) for _, r in timed])
    median = float(statistics.median(v_ref))
    out, factors, outside = [], [], 0
    for r in rows:
        t, v = _seconds(r.get("timestamp")), number(r.get(column))
        if r.get("status") != "ok" or not v or t is None:
            out.append(r)
        elif not t_ref[0] <= t <= t_ref[-1]:
            outside += 1
            out.append(r)
        else:
            factor = median / float(np.interp(t, t_ref, v_ref))
            factors.append(factor)
            out.append({**r, column: v * factor})
    return out, {"applied": True, "network": config[0], "batch_size": int(config[1]), "measurements": len(timed),
                 "median_ms": round(median, 3), "cv_pct": round(float(100 * np.std(v_ref) / np.mean(v_ref)), 2),
                 "rows_corrected": len(factors), "rows_outside_span": outside,
                 "factor_range": [round(min(factors), 4), round(max(factors), 4)] if factors else None}


def drift_line(drift: dict[str, Any]) -> str:
    """One line on a drift reference's correction of the step times (:func:`normalise_step_times`' summary)."""
    if not drift.get("applied"):
        return f"step times not corrected for drift: {drift.get('reason', '')}"
    lo, hi = drift.get("factor_range") or (1.0, 1.0)
    return (f"step times corrected for drift by the reference {drift['network']} @ {drift['batch_size']} "
            f"({drift['measurements']} measurements, median {drift['median_ms']:.1f} ms, CV {drift['cv_pct']:.1f}%): "
            f"{drift['rows_corrected']} rows scaled by x{lo:.2f} .. x{hi:.2f}, {drift['rows_outside_span']} outside "
            "its span left as measured")
