"""Exporters of this tool's measurements and graphs into other tools' formats."""

from perf4sight.exporters.perfseer import export_perfseer

__all__ = ["export_perfseer"]
