"""`python -m benchmarks`: run the benchmarks, each in its own process (so peak RSS is its own), write
benchmarks/results/<name>.json (<name>.quick.json with --quick), refresh README's results table and print it, labelled.
    python -m benchmarks                      # everything, full sizes (several times --quick; see README)
    python -m benchmarks --quick              # short run of everything (~2.25 minutes on 2 cores)
    python -m benchmarks bus durable          # pick benchmarks: bus, durable, pipeline, idle, supervisor_scan
    python -m benchmarks pipeline --profile   # also record devhost and the Agent with py-spy
    python -m benchmarks --table              # the results table from the committed JSON (<name>.quick.json: --quick)
    python -m benchmarks compare [--quick] [--json]   # ours against DBOS (needs requirements-bench.txt: make bench)
    python -m benchmarks azure_cost | transports | profile_system [-h]   # Azure's counts; the transports; CPU
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

from .common import RESULTS_DIR, ROOT, python, write_result

NAMES = ("bus", "durable", "pipeline", "idle", "supervisor_scan")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all of {', '.join(NAMES)}); `compare` has its own options (compare -h)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes; results go to <name>.quick.json")
    p.add_argument("--profile", action="store_true", help="pipeline: profile devhost and the Agent with py-spy")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder (default benchmarks/results)")
    p.add_argument("--table", action="store_true", help="print the results table and exit")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    return p


def run_one(name: str, quick: bool, profile: bool, out: Path) -> Path:
    module = importlib.import_module(f"benchmarks.{name}")
    figures, params = module.run(quick, profile) if name == "pipeline" else module.run(quick)
    return write_result(name, figures, quick=quick, params=params, out_dir=out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "compare" in argv and "--table" not in argv:  # its own options and result document (benchmarks/compare.py)
        from . import compare

        return compare.main([a for a in argv if a != "compare"])
    if "azure_cost" in argv and "--table" not in argv:  # its own options and result document (benchmarks/azure_cost.py)
        from . import azure_cost

        return azure_cost.main([a for a in argv if a != "azure_cost"])
    if "transports" in argv and "--table" not in argv:  # its own options and result document (benchmarks/transports.py)
        from . import transports

        return transports.main([a for a in argv if a != "transports"])
    if "profile_system" in argv and "--table" not in argv:  # its own options (benchmarks/profile_system.py)
        from . import profile_system

        return profile_system.main([a for a in argv if a != "profile_system"])
    args = _parser().parse_args(argv)
    from . import report

    if args.table:
        print(report.labelled_table(args.names or None, quick=args.quick, results_dir=args.out))
        return 0
    names = args.names or list(NAMES)
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        _parser().error(f"unknown benchmark(s) {unknown}; choose from {', '.join(NAMES)}")
    if args.in_process:
        for name in names:
            print(f"wrote {run_one(name, args.quick, args.profile, args.out)}", flush=True)
        return 0
    failed = []
    for name in names:
        started = time.monotonic()
        print(f"== {name}{' (quick)' if args.quick else ''}", flush=True)
        argv_one = [python(), "-m", "benchmarks", name, "--in-process", "--out", str(args.out)]
        argv_one += ["--quick"] * args.quick + ["--profile"] * args.profile
        if subprocess.run(argv_one, cwd=ROOT, check=False).returncode != 0:
            failed.append(name)
        print(f"   {name} took {time.monotonic() - started:.0f} s", flush=True)
    if not args.quick and args.out == RESULTS_DIR:
        report.update_readme()
    print(report.labelled_table(names, quick=args.quick, results_dir=args.out))  # what this run measured
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
