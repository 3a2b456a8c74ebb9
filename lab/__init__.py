"""The lab: the demo, up/down, the local system, every drill with its invariants and report, the racers, the
remote-service simulator and the Agent's fault switches (`python -m lab --help`). It may import everything; nothing
imports it but devhost's command aliases (`python -m devhost demo|drill|drills|up|down`). Never deployed."""
