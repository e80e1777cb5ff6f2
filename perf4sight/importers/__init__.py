"""Importers of measurements from other tools into the tidy schema, by ``--format`` name."""

from perf4sight.importers.perf4sight_csv import ImportSummary, import_perf4sight
from perf4sight.importers.perfseer import import_perfseer

__all__ = ["ImportSummary", "import_perf4sight", "import_perfseer", "IMPORTERS"]

#: ``--stage import --format NAME`` -> importer(source_dir, device, profiling_dir, models_dir) -> ImportSummary
IMPORTERS = {"perf4sight": import_perf4sight, "perfseer": import_perfseer}
