"""``python -m weir.scenarios [NAME [ARGS]]``: what ``weir scenario`` runs."""

import sys

from weir.scenarios.registry import main

sys.exit(main())
