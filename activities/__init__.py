"""Activities: the only code the Scheduler calls. Each one is idempotent (at-least-once delivery)."""
