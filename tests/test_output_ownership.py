"""No file that is not ours replaced: an output option (--json, --out, --gantt, --trace) refuses an existing file
that simtrain did not write, with exit 2 and one sentence, and leaves it byte for byte; simtrain's own earlier
outputs (and empty files) are replaced as before (simtrain.report.outputs.check_replaceable). Found by a user-level
audit: `sweep --out p.csv` replaced a user's p.csv."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import REPO, run_cli

SCENARIO = str(REPO / "scenarios" / "pp4_dp4.yaml")
#: files other programs write: a spreadsheet export, a hand-written JSON, a PyTorch-profiler trace, a web page
THEIRS = {"p.csv": "name,salary\nalice,100\n", "precious.json": '{"salary": 100}\n',
          "t.json": '{\n  "schemaVersion": 1,\n  "traceEvents": []\n}\n',
          "mine.html": "<html><body>notes</body></html>\n"}


@pytest.mark.parametrize(("name", "args"), [
    ("precious.json", ["run", SCENARIO, "--json", "{}"]),
    ("mine.html", ["run", SCENARIO, "--gantt", "{}"]),
    ("t.json", ["run", SCENARIO, "--trace", "{}"]),
    ("p.csv", ["sweep", SCENARIO, "--grid", "training.micro_batch=1,2", "--out", "{}"]),
])
def test_an_output_option_never_replaces_another_programs_file(tmp_path, capsys, name, args):
    target = tmp_path / name
    target.write_text(THEIRS[name], encoding="utf-8")
    code, _, err = run_cli([a.replace("{}", str(target)) for a in args], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "exists and is not a file simtrain wrote" in err and name in err, err
    assert target.read_text(encoding="utf-8") == THEIRS[name]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]      # nothing beside it either


def test_simtrains_own_outputs_and_empty_files_are_replaced(tmp_path, capsys):
    """Run twice into the same report, chart, trace and table: the second run replaces the first's files; an empty
    file (made by touch or mktemp) is replaced too."""
    out = {k: tmp_path / k for k in ("r.json", "g.html", "t.json", "s.csv", "empty.json")}
    out["empty.json"].write_text("", encoding="utf-8")
    for _ in range(2):
        code, _, err = run_cli(["run", SCENARIO, "--json", str(out["r.json"]), "--gantt", str(out["g.html"]),
                                "--trace", str(out["t.json"])], capsys)
        assert code == 0, err
        code, _, err = run_cli(["sweep", SCENARIO, "--grid", "training.micro_batch=1", "--out", str(out["s.csv"])],
                               capsys)
        assert code == 0, err
    code, _, err = run_cli(["memory", SCENARIO, "--json", str(out["empty.json"])], capsys)
    assert code == 0, err
    assert out["empty.json"].read_text(encoding="utf-8").startswith('{\n "')


def test_write_table_rewrites_a_table_with_the_same_header(tmp_path):
    """A DataFrame written by simtrain.decide write_table may lack simtrain's own columns: the file is still
    recognised as the same table by its header line, while a different CSV is refused."""
    import pandas as pd

    from simtrain.decide.sweep_files import write_table
    from simtrain.spec.errors import InputError

    path = tmp_path / "t.csv"
    write_table(pd.DataFrame({"a": [1], "b": [2]}), path)
    write_table(pd.DataFrame({"a": [3], "b": [4]}), path)
    assert path.read_text(encoding="utf-8") == "a,b\n3,4\n"
    path.write_text("x,y\n1,2\n", encoding="utf-8")
    with pytest.raises(InputError, match="not a file simtrain wrote"):
        write_table(pd.DataFrame({"a": [5], "b": [6]}), path)
    assert path.read_text(encoding="utf-8") == "x,y\n1,2\n"


def test_a_folder_where_no_file_can_be_made_names_the_target_not_the_temporary(capsys):
    """simtrain writes a temporary file beside the target and renames it: where no file can be made (/proc, even
    for root), exit 2 names the file asked for (it named '/proc/.r.json.xxxx.tmp' before)."""
    import os
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    code, _, err = run_cli(["memory", SCENARIO, "--json", "/proc/simtrain-r.json"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: cannot write '/proc/simtrain-r.json': ") and ".tmp" not in err, err


@pytest.mark.parametrize(("side", "content", "says"), [
    ("p.csv.sweep.json", "my notes\n", "cannot write 'p.csv.sweep.json': it exists and is not a file simtrain wrote"),
    ("p.csv.lock", "x\n", "cannot lock 'p.csv.lock': it exists and is not a sweep's lock file"),
])
def test_a_sweep_never_replaces_or_removes_another_programs_file_beside_its_table(tmp_path, monkeypatch, capsys,
                                                                                 side, content, says):
    """A sweep writes its record (<out>.sweep.json) and holds <out>.lock beside the table, removing the lock at the
    end: a file of another program at either path is refused before any point runs, and left as it was (found by
    review: the record was replaced and the lock file removed)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / side).write_text(content, encoding="utf-8")
    code, _, err = run_cli(["sweep", SCENARIO, "--grid", "training.micro_batch=1", "--out", "p.csv"], capsys)
    assert code == 2 and says in err, err
    assert (tmp_path / side).read_text(encoding="utf-8") == content
    assert not (tmp_path / "p.csv").exists()


def test_the_sweep_record_leaves_the_models_warnings_out():
    """ModelSpec.unmodelled (the config reader's warnings) changes no row: it is not in the sweep's record, so a
    table written before the field existed still resumes (found by review)."""
    import simtrain
    from simtrain.decide.sweep_files import sweep_identity
    model = sweep_identity(simtrain.load_scenario("pp4_dp4"), {"training.micro_batch": [1]})["model"]
    assert "unmodelled" not in model and model["hidden"] == 5120


def test_the_sweep_record_of_a_model_without_qkv_biases_is_the_one_written_before_them():
    """qkv_bias (this session) is left out of the sweep's record where it is false, so tables written before it
    existed resume (review: '--resume' refused them, 'its rows were computed for another model'); the record's model
    keys are those written at 1afc5ff, listed here as that version wrote them. A model with the biases records it."""
    import simtrain
    from simtrain.decide.sweep_files import sweep_identity
    scenario = simtrain.load_scenario("pp4_dp4")
    model = sweep_identity(scenario, {"training.micro_batch": [1]})["model"]
    assert sorted(model) == ["attention", "attention_window", "bias", "dropout", "ffn_hidden", "head_dim", "heads",
                             "hidden", "kv_heads", "layers", "max_positions", "mlp", "moe", "mtp_layers", "name",
                             "norm", "position_embeddings", "qk_norm", "tied_embeddings", "vocab"]
    biased = dataclasses.replace(scenario, model=scenario.model.model_copy(update={"qkv_bias": True}))
    assert sweep_identity(biased, {"training.micro_batch": [1]})["model"]["qkv_bias"] is True


def test_resume_never_replaces_another_programs_record(tmp_path, monkeypatch, capsys):
    """--resume rewrites <out>.sweep.json too: a file of another program there is refused (second review)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.csv.sweep.json").write_text("my notes\n", encoding="utf-8")
    code, _, err = run_cli(["sweep", SCENARIO, "--grid", "training.micro_batch=1", "--workers", "1", "--out", "b.csv",
                            "--resume"], capsys)
    assert code == 2 and "cannot write 'b.csv.sweep.json'" in err, err
    assert (tmp_path / "b.csv.sweep.json").read_text(encoding="utf-8") == "my notes\n"


def test_a_fifo_at_the_lock_path_is_refused_not_waited_on(tmp_path, monkeypatch, capsys):
    """Reading a FIFO blocks until a writer comes: a FIFO at <out>.lock is refused at once (second review: the
    sweep hung)."""
    import os
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "e.csv.lock")
    code, _, err = run_cli(["sweep", SCENARIO, "--grid", "training.micro_batch=1", "--workers", "1", "--out", "e.csv"],
                           capsys)
    assert code == 2 and "cannot lock 'e.csv.lock': it exists and is not a regular file" in err, err


def test_a_csv_sweep_ignores_a_partial_file_it_never_writes(tmp_path, monkeypatch, capsys):
    """Only a Parquet sweep keeps its rows in <out>.partial.jsonl: a CSV sweep runs beside such a file of another
    program, and leaves it alone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.csv.partial.jsonl").write_text("notes\n", encoding="utf-8")
    code, _, err = run_cli(["sweep", SCENARIO, "--grid", "training.micro_batch=1", "--workers", "1", "--out", "c.csv"],
                           capsys)
    assert code == 0, err
    assert (tmp_path / "c.csv.partial.jsonl").read_text(encoding="utf-8") == "notes\n"
