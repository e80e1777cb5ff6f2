"""perf4sight: predict CNN training-step time and memory on edge devices."""

__version__ = "0.1.0"
