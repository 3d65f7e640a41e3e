"""Write the golden JSON reports that tests/test_layout_reports.py compares against.

Run it only when a change is meant to alter the reports (a new report field, a corrected cost), and say in the
commit what changed and why: ``python tests/data/regenerate_golden_reports.py``. Each bundled scenario's report is
written exactly as ``simtrain run scenarios/NAME.yaml --json`` writes it, gzipped without a timestamp (so the bytes
depend on the report only).
"""

import gzip
from pathlib import Path

import simtrain
from simtrain.report.outputs import dumps_json

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "golden_reports"


def main() -> None:
    for old in OUT.glob("*.json.gz"):
        old.unlink()
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        text = dumps_json(simtrain.simulate(path).to_dict())
        (OUT / f"{path.stem}.json.gz").write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        print(f"{path.stem}: {len(text):,} bytes")


if __name__ == "__main__":
    main()
