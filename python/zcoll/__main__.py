"""``python -m zcoll``: the same as the ``zcoll`` command (``zcoll info`` when given nothing)."""
import sys

from .tools.cli import main

sys.exit(main(sys.argv[1:] or ["info"]))
