"""``python -m minitx``: the entry point (see minitx/cli.py)."""
import sys

from .cli import main

sys.exit(main())
