"""perf4sight command line, run from the project folder: ``python main.py --config config.toml --stage all``.

The command line itself is ``perf4sight.cli`` (also ``perf4sight`` and ``python -m perf4sight`` once installed).
"""
import sys

from perf4sight.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="main.py"))
