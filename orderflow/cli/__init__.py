"""The operator tools, never deployed (`.funcignore` and the Agent's `.dockerignore` leave this package out):
`main` (`orderflow`, `python -m orderflow`) with its client-app commands (`client`) and operator commands (`ops`,
`common`), and the circuit-breaker command (`breaker`, also `python -m orderflow.cli.breaker`). They import the core;
nothing deployed imports them."""
