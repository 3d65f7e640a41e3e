"""Golden reports: every bundled scenario's JSON report is byte-identical to its committed fixture
(tests/data/golden_reports, gzipped). The fixtures were first written at 18a7a03, before the package moved into
its layers, so the move is checked to change no report; a later change that is meant to alter reports regenerates
them (tests/data/regenerate_golden_reports.py) and says in its commit what changed and why."""

import gzip
from pathlib import Path

import pytest

import simtrain
from simtrain.report.outputs import dumps_json

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "golden_reports"
SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))


def test_every_bundled_scenario_has_a_fixture():
    """A scenario added later needs its own fixture; one removed leaves no stale fixture behind."""
    assert sorted(p.name[: -len(".json.gz")] for p in FIXTURES.glob("*.json.gz")) == SCENARIOS


@pytest.mark.parametrize("name", SCENARIOS)
def test_report_is_byte_identical_to_the_fixture(name):
    """`simtrain run scenarios/NAME.yaml --json` writes the same bytes as before the layout move."""
    report = dumps_json(simtrain.simulate(ROOT / "scenarios" / f"{name}.yaml").to_dict())
    expected = gzip.decompress((FIXTURES / f"{name}.json.gz").read_bytes()).decode()
    assert report == expected
