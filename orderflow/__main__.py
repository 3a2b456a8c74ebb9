"""`python -m orderflow`: the operator CLI (orderflow/cli)."""

import sys

from orderflow.cli import main

sys.exit(main())
