"""``python -m foxdqn.report DIR``: write and print the report of a sweep folder (the tables and plots
of :mod:`foxdqn.report.tables`)."""
from __future__ import annotations

import sys

from foxdqn.report.tables import check_sweep_dir, console_text, write_report
from foxdqn.errors import FoxdqnError

USAGE = "usage: python -m foxdqn.report MULTIRUN_DIR  (writes report.md, report.json, report.csv and plots/ there)"


def main(argv: list[str] | None = None) -> int:
    """``python -m foxdqn.report DIR``: write and print the report of every job in DIR. Returns the
    exit code: 0, or 2 after one ``foxdqn: error:`` line (bad arguments, not a sweep folder, a
    folder that cannot be written)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        helping = bool(argv) and argv[0] in ("-h", "--help")
        print(USAGE, file=sys.stdout if helping else sys.stderr)
        return 0 if helping else 2
    try:
        sweep_dir = check_sweep_dir(argv[0])
        report = write_report(sweep_dir)
    except FoxdqnError as exc:
        print(f"foxdqn: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"foxdqn: error: cannot write the report into {argv[0]}: {exc}", file=sys.stderr)
        return 2
    print(console_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
