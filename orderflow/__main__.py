"""`python -m orderflow`: the operator CLI, orderflow/cli/main.py (not deployed: the ignore files list this file)."""

from orderflow.cli.main import main

raise SystemExit(main())
