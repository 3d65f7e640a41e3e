"""Reading YAML through libyaml (PyYAML's C parser) where it reads as PyYAML's Python parser does.

The expected values come from PyYAML's own Python parser (``yaml.SafeLoader``, the reader simtrain used alone
before), not from the code under test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from simtrain.spec import yamlio
from simtrain.spec.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("hardware/*.yaml"), *ROOT.glob("scenarios/*.yaml"), *ROOT.glob("simtrain/presets/*.yaml"),
                *ROOT.glob("benchmarks/scenarios/*.yaml"), *ROOT.glob("simtrain/validation/*.yaml")])

needs_libyaml = pytest.mark.skipif(yamlio._FastLoader is None, reason="PyYAML built without libyaml")


def _python_parser(text: str):
    """What PyYAML's Python parser makes of ``text``, with simtrain's line-keeping mappings and lists."""
    loader = yamlio._Loader(text)
    try:
        node = loader.get_single_node()
        return yamlio._construct(loader, node) if node is not None else None
    finally:
        loader.dispose()


def _with_lines(value):
    """A value with every line it records, for comparing two readings."""
    if isinstance(value, yamlio.LineDict):
        return ("map", value.line, [(k, value.key_lines[k], _with_lines(v)) for k, v in value.items()])
    if isinstance(value, yamlio.LineList):
        return ("list", value.line, [_with_lines(v) for v in value])
    return (type(value).__name__, value)


@needs_libyaml
def test_bundled_files_read_alike_and_the_hardware_files_take_the_c_parser():
    """Every bundled hardware, scenario, preset and cases file gives the same values and lines as PyYAML's Python
    parser; the hardware files (block scalars, quoted sources holding '>' and '%') are read by the C parser."""
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        assert _with_lines(yamlio.load_yaml_text(text, path.name)) == _with_lines(_python_parser(text)), path.name
    for path in ROOT.glob("hardware/*.yaml"):
        done, _ = yamlio._fast_document(path.read_text(encoding="utf-8"))
        assert done, path.name


@needs_libyaml
@pytest.mark.parametrize("text", [
    "a: 1\nb: x\tc\n",                 # a tab inside a plain scalar: libyaml reads 'x\tc', PyYAML refuses it
    "a: {b: 1?c}\n",                   # '?' inside a flow mapping: libyaml reads '1?c'
    "a: >#-\n  text\n",                # a block header running into a comment: libyaml reads 'text\n'
])
def test_texts_libyaml_reads_but_pyyaml_refuses_keep_the_python_error(text):
    """Where libyaml accepts what PyYAML's Python parser refuses, the C parser is not used: the text is refused
    with the Python parser's error, located at its line."""
    assert yamlio._fast_document(text) == (False, None)
    with pytest.raises(yaml.YAMLError):
        _python_parser(text)
    with pytest.raises(InputError, match=r"^x\.yaml:\d+: "):
        yamlio.load_yaml_text(text, "x.yaml")


@needs_libyaml
@pytest.mark.parametrize("text", [
    "a: !\nb: 1\n",                    # an empty tag: libyaml reads '', PyYAML None
    "a: 1\n\ufeffb: 2\n",              # a byte-order mark inside the text: libyaml refuses, PyYAML reads a key
])
def test_texts_the_parsers_read_differently_take_the_python_parser(text):
    """Where the two parsers disagree on a text's value, the C parser is not used: PyYAML's Python reading stands."""
    assert yamlio._fast_document(text) == (False, None)
    assert _with_lines(yamlio.load_yaml_text(text, "x.yaml")) == _with_lines(_python_parser(text))


@needs_libyaml
def test_block_scalars_quoted_text_and_comments_read_alike():
    """A folded source, quoted text holding structure characters, comments holding them, and an anchor (read by the
    Python parser): the same values and lines as PyYAML's Python parser."""
    cases = {
        'bandwidth: {value: 900 GB/s, source: ">50% of links | see *note* @x `y`?"}  # why? 100% & more\n'
        "latency:\n  value: 2 us\n  source: >-\n    folded text\n    on two lines\n": True,
        "rows:\n  - [1, 2.5, 'a: b']\n  - {x: null, y: true}\n": True,
        "base: &b {x: 1}\nuse: *b\n": False,
    }
    for text, fast in cases.items():
        assert yamlio._fast_document(text)[0] is fast
        assert _with_lines(yamlio.load_yaml_text(text, "x.yaml")) == _with_lines(_python_parser(text))


def _alias_bomb(levels: int) -> str:
    """Each level lists the previous one ten times through an alias: 10 values at level 0, so about 10^(levels+1)
    values once expanded, in a few hundred bytes of text."""
    text = "&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"
    for i in range(1, levels + 1):
        text = f"&a{i} [{', '.join([text] + [f'*a{i - 1}'] * 9)}]"
    return f"training:\n  recompute_modules: {text}\n"


def test_aliases_that_expand_past_the_bound_are_refused_at_their_line():
    """Five levels expand to 10^6 values plus the lists (more than 200,000) from about 500 bytes: refused, naming
    line 2, before any value is built; three levels (about 11,000) are read, each alias the same list."""
    text = _alias_bomb(5)
    assert len(text) < 1000
    with pytest.raises(InputError, match="expand to more than 200,000 values") as err:
        yamlio.load_yaml_text(text, "bomb.yaml")
    assert err.value.line == 2 and err.value.file == "bomb.yaml"
    small = yamlio.load_yaml_text(_alias_bomb(3), "small.yaml")["training"]["recompute_modules"]
    assert len(small) == 10 and small[1] is small[2] and len(small[1]) == 10


def test_a_file_without_aliases_is_never_refused_for_its_size():
    """300,000 plain values (more than the alias bound) have nothing to expand: read as written."""
    text = "x: [" + ", ".join(["1"] * 300_000) + "]\n"
    assert len(yamlio.load_yaml_text(text, "big.yaml")["x"]) == 300_000


def test_a_huge_value_is_quoted_short_in_the_one_line_message(tmp_path, capsys):
    """A list of 100,000 items where a word is expected (training.precision): exit 2 and one line of at most 2,000
    characters, the value cut to its first items, not the whole list."""
    from conftest import REPO, run_cli
    sc = tmp_path / "s.yaml"
    base = (REPO / "scenarios" / "pp4_dp4.yaml").read_text(encoding="utf-8")
    assert "\n  precision: bf16\n" in base
    sc.write_text(base.replace("\n  precision: bf16\n", "\n  precision: [" + ", ".join(["7"] * 100_000) + "]\n", 1),
                  encoding="utf-8")
    code, _, err = run_cli(["run", str(sc)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err[:300]
    assert "training.precision: [7, 7, 7" in err and "is not allowed (allowed: 'bf16'" in err, err[:300]
    assert len(err) < 300, len(err)     # the 300,000-character value is cut to 60 characters


@pytest.mark.parametrize(("value", "says"), [
    ("[10, 10, ten, 10]", "parallel.layers_per_stage.2: 'ten' is not a whole number"),
    ("autox", "parallel.layers_per_stage: 'autox' is not allowed (did you mean 'auto'?) (allowed: 'auto', or a list)"),
])
def test_a_field_of_a_word_or_a_list_names_the_field_not_the_union_branch(capsys, value, says):
    """layers_per_stage takes 'auto' or a list of whole numbers: the field is named as the file writes it (not
    'layers_per_stage.list[int].2', pydantic's branch), and a wrong word is told that 'auto' and a list are allowed."""
    from conftest import REPO, run_cli
    code, _, err = run_cli(["run", str(REPO / "scenarios" / "pp4_dp4.yaml"), "--set",
                            f"parallel.layers_per_stage={value}"], capsys)
    assert code == 2 and says in err and "list[int]" not in err, err


@pytest.mark.parametrize("text", ["model: &m {hidden: 8, self: *m}\n", "a: &x [1, *x]\n"])
def test_an_alias_inside_its_own_anchor_is_refused_at_once(text):
    """A value that contains itself (an alias inside its anchor's value) is refused at its line; the first version of
    the expansion bound looped on it without end (found by review)."""
    with pytest.raises(InputError, match="stands inside the value its anchor") as err:
        yamlio.load_yaml_text(text, "self.yaml")
    assert err.value.line == 1


def test_a_command_line_value_is_bounded_like_a_file():
    """--set, --grid and --fix values are YAML too: five levels of aliases (10^6 values) are refused before any value
    is built, naming the value; a value with one shared alias reads as written."""
    from simtrain.spec.option_values import parse_value
    bomb = _alias_bomb(5).split("recompute_modules: ", 1)[1].strip()
    with pytest.raises(InputError, match="expand to more than 200,000 values"):
        parse_value(bomb)
    assert parse_value("[&a [1, 2], *a]") == [[1, 2], [1, 2]]


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "training.recompute_modules=&a [core_attn, *a]"],
     "--set 'training.recompute_modules=&a [core_attn, *a]': an alias (*name) stands inside"),
    (["--set", "training.recompute_modules=" + "[" * 3000 + "]" * 3000], "it nests too deeply to be a simtrain value"),
])
def test_a_command_line_value_refused_names_its_option(capsys, args, says):
    """A value refused for its aliases or its depth names the option it came from, exit 2 (second review: the depth
    crashed with exit 1, the alias message named no option)."""
    from conftest import REPO, run_cli
    code, _, err = run_cli(["run", str(REPO / "scenarios" / "pp4_dp4.yaml"), *args], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err[:300]


@pytest.mark.parametrize("text, expected", [
    # a key written beside a merge overrides the merged one (YAML 1.1's merge key type, yaml.org/type/merge.html:
    # "the key is ... overridden by ... the current mapping")
    ("a: &a {seq_len: 1, micro_batch: 2}\nb:\n  <<: *a\n  seq_len: 3\n", {"seq_len": 3, "micro_batch": 2}),
    # of several merged mappings the earlier one wins ("earlier mappings in the sequence override later ones");
    # PyYAML 6.0.4's own flatten_mapping gives 2 here for keys longer than one letter, 6.0.2 gives 1
    ("a: &a {seq_len: 1}\nc: &c {seq_len: 2, global_batch: 5}\nb:\n  <<: [*a, *c]\n",
     {"seq_len": 1, "global_batch": 5}),
    # a merge of a mapping that itself merges: its own written key wins inside it, then it is merged whole
    ("x: {<<: &B {<<: &C {k: 1}, k: 2}}\ny: *B\nb:\n  <<: *B\n", {"k": 2}),
])
def test_a_merged_key_is_overridden_as_yaml_says(tmp_path, text, expected):
    """The audit found `<<: *c` then an explicit `seq_len` refused as "key 'seq_len' appears twice"; the review,
    that the precedence of several merges followed the installed PyYAML. Expected values: the merge key type's
    rules, applied by hand."""
    path = tmp_path / "m.yaml"
    path.write_text(text, encoding="utf-8")
    assert dict(yamlio.load_yaml(path)["b"]) == expected


def test_a_merge_records_the_lines_keys_came_from(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("a: &a {seq_len: 1, micro_batch: 2}\nb:\n  <<: *a\n  seq_len: 3\n", encoding="utf-8")
    assert yamlio.load_yaml(path)["b"].key_lines == {"seq_len": 4, "micro_batch": 1}


@pytest.mark.parametrize("text, line, says", [
    ("b:\n  <<: {k: 1, k: 2}\n", 2, "key 'k' appears twice in the same mapping"),
    ("b:\n  <<: 5\n", 2, "a merge (<<) takes a mapping or a list of mappings, not '5'"),
    # a tagged mapping builds another type (exit 1, AttributeError, in the first mend)
    ("b:\n  <<: !!set {a}\n", 2,
     "a merge (<<) takes a mapping or a list of mappings, not a mapping tagged tag:yaml.org,2002:set"),
])
def test_a_bad_merge_is_refused_at_its_line(tmp_path, text, line, says):
    path = tmp_path / "m.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=re.escape(says)) as err:
        yamlio.load_yaml(path)
    assert err.value.line == line


def test_a_key_written_twice_beside_a_merge_is_still_refused(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("a: &a {x: 1}\nb:\n  <<: *a\n  y: 1\n  y: 2\n", encoding="utf-8")
    with pytest.raises(InputError, match="key 'y' appears twice in the same mapping") as err:
        yamlio.load_yaml(path)
    assert err.value.line == 5
