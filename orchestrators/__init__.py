"""The Scheduler: deterministic Durable orchestrations (no I/O; all effects through activities)."""
