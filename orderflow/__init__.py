"""orderflow: the domain core of the Scheduler Agent Supervisor order pipeline (no azure.functions here)."""
