"""Importers of measurements from other tools into the tidy schema."""

from perf4sight.importers.perf4sight_csv import ImportSummary, import_perf4sight

__all__ = ["ImportSummary", "import_perf4sight"]
