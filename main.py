"""perf4sight command line, run from the project folder: ``python main.py --config config.toml --stage all``.

The command line itself is ``perf4sight.cli`` (also ``perf4sight`` and ``python -m perf4sight`` once installed).
"""
import sys

try:
    from perf4sight.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python reads the command line's code: one line, not a traceback
    print("interrupted: nothing was written", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main(prog="main.py"))
