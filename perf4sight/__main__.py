"""``python -m perf4sight --config config.toml --stage all``: the command line (``perf4sight.cli``)."""
import sys

from perf4sight.cli import main

sys.exit(main(prog="python -m perf4sight"))
