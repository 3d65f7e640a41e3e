"""Write simtrain/validation/errors.json: the gated cases' errors of every bundled cases file, from which
`simtrain run` draws its step-time band (simtrain.report.bands). Run it after any change that moves
`simtrain validate`'s figures (tests/test_validate*.py fail until it is run):
``python tests/data/regenerate_validation_errors.py``."""

from pathlib import Path

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v
from simtrain.report.outputs import dumps_json

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    results = [r for name in case_files.bundled_case_files() for r in v.validate(name)]
    table = v.error_table(results)
    (ROOT / "simtrain" / "validation" / "errors.json").write_text(dumps_json(table))
    print(f"{len(table['cases'])} gated cases")


if __name__ == "__main__":
    main()
