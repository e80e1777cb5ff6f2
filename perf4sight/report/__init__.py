"""The compare stage: a report setting every fingerprinted device side by side.

``compare`` orchestrates (``compare_devices``), ``data`` gathers the figures, ``plots`` draws the
PNGs (matplotlib, Agg) and ``render`` writes the same blocks as HTML and Markdown.
"""
