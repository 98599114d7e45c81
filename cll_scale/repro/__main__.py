"""``python -m cll_scale.repro``: the ``cll-repro`` command."""
import sys

from cll_scale.repro.cli import main

sys.exit(main())
