"""Unit strings in files become SI floats inside (issue 2, deliverable 2).

Expected values are the SI definitions: decimal prefixes are powers of 1000, binary
prefixes (Ki, Mi, Gi) powers of 1024 (IEC 80000-13), ``B`` is a byte and ``b`` a bit.
"""

from __future__ import annotations

import pytest
from conftest import hardware_variant

from simtrain.spec.errors import InputError
from simtrain.spec.units import parse_quantity


@pytest.mark.parametrize(("text", "kind", "expected"), [
    ("989 TFLOPS", "flops", 989e12),
    ("989 TFLOP/s", "flops", 989e12),
    ("80 GiB", "bytes", 80 * 2**30),
    ("80 GB", "bytes", 80e9),
    ("512 MiB", "bytes", 512 * 2**20),
    ("3.35 TB/s", "bandwidth", 3.35e12),
    ("450 GB/s", "bandwidth", 450e9),
    ("400 Gb/s", "bandwidth", 50e9),
    ("200 Gbps", "bandwidth", 25e9),
    ("1 GiB/s", "bandwidth", 2**30),
    ("2 us", "time", 2e-6),
    ("5 µs", "time", 5e-6),     # U+00B5 MICRO SIGN
    ("5 μs", "time", 5e-6),     # U+03BC GREEK SMALL LETTER MU
    ("1.5 ms", "time", 1.5e-3),
    ("10 ns", "time", 10e-9),
])
def test_unit_strings_become_si(text, kind, expected):
    """A unit string parses to its SI value (s, bytes, FLOP/s, bytes/s)."""
    assert parse_quantity(text, kind) == pytest.approx(expected, rel=1e-12)


def test_bare_number_is_already_si():
    """A bare number is taken as SI, unchanged: how Python callers pass quantities."""
    assert parse_quantity(4.5e9, "bandwidth") == 4.5e9
    assert parse_quantity(3, "time") == 3.0


def test_bits_and_bytes_differ_in_bandwidth():
    """'b' is a bit and 'B' a byte: 400 Gb/s is one eighth of 400 GB/s."""
    assert parse_quantity("400 GB/s", "bandwidth") == pytest.approx(400e9)
    assert parse_quantity("400 Gb/s", "bandwidth") == pytest.approx(400e9 / 8)


def test_bits_are_not_bytes_in_sizes():
    """A size in bits ('1 Gb') is never read as 1 GB: it is either 1/8 GB or refused."""
    try:
        value = parse_quantity("1 Gb", "bytes")
    except InputError:
        return
    assert value == pytest.approx(1e9 / 8)


def test_binary_and_decimal_prefixes_differ():
    """GiB is 2**30 bytes, GB is 1e9 bytes (IEC vs SI prefixes)."""
    assert parse_quantity("1 GiB", "bytes") / parse_quantity("1 GB", "bytes") == pytest.approx(2**30 / 1e9)


@pytest.mark.parametrize(("text", "kind", "unit"), [
    ("80 G", "bytes", "G"),            # ambiguous: G what?
    ("80 gb", "bytes", "gb"),          # lower-case g is no SI prefix
    ("3.35 TB", "bandwidth", "TB"),    # a size where a rate is expected
    ("450 GB/s", "bytes", "GB/s"),     # a rate where a size is expected
    ("989 TB/s", "flops", "TB/s"),
    ("2 parsecs", "time", "parsecs"),
])
def test_unknown_or_ambiguous_unit_is_an_error_naming_it(text, kind, unit):
    """An unknown or ambiguous unit raises InputError that quotes the unit and the value."""
    with pytest.raises(InputError) as exc:
        parse_quantity(text, kind)
    message = str(exc.value)
    assert f"'{unit}'" in message and text in message


def test_not_a_quantity_is_an_error():
    """Text that is no number with a unit raises InputError saying what was expected."""
    with pytest.raises(InputError, match="is not a bandwidth"):
        parse_quantity("fast", "bandwidth")


def test_bad_unit_in_a_file_names_file_line_and_field(tmp_path):
    """A bad unit in a hardware file is reported as file:line: field: problem."""
    from simtrain.spec.hardware import load_hardware

    path = hardware_variant(tmp_path, {"gpu.memory": {"value": "80 G", "source": "x"}})
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("memory:"))
    with pytest.raises(InputError) as exc:
        load_hardware(str(path), base_dir=tmp_path, file="scenario.yaml")
    assert str(exc.value).startswith(f"{path}:{line}: gpu.memory: ")
    assert "'G'" in str(exc.value)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("intra_node.bandwidth", 450,
     "intra_node.bandwidth: 450 has no unit: write a bandwidth with one, e.g. '3.35 TB/s'"),
    ("intra_node.latency", {"value": 0.6, "source": "x"}, "intra_node.latency: 0.6 has no unit: write a time"),
    ("gpu.memory", 81559, "gpu.memory: 81559 has no unit: write bytes with one"),
    ("gpu.peak_flops.bf16", 989.5, "gpu.peak_flops.bf16: 989.5 has no unit: write a compute rate"),
])
def test_bare_number_in_a_file_is_refused(tmp_path, field, value, says):
    """In a file a physical quantity needs its unit: '450' for a bandwidth is a typo for '450 GB/s', and read
    as 450 B/s it would make a step take years without a word (the user audit's worst finding)."""
    from simtrain.spec.hardware import load_hardware

    path = hardware_variant(tmp_path, {field: value})
    with pytest.raises(InputError) as exc:
        load_hardware(str(path), base_dir=tmp_path, file="scenario.yaml")
    assert says in str(exc.value)


def test_zero_needs_no_unit_in_a_file(tmp_path):
    """0 is 0 in every unit: a zero latency reads as written."""
    from simtrain.spec.hardware import load_hardware

    path = hardware_variant(tmp_path, {"intra_node.latency": 0})
    assert load_hardware(str(path), base_dir=tmp_path, file="scenario.yaml")[0].intra_node.latency == 0.0


@pytest.mark.parametrize(("value", "shown"), [("450", "'450'"), ("450e9", "'450e9'")])
def test_a_number_written_as_text_still_needs_a_unit(tmp_path, value, shown):
    """YAML reads a quoted "450" and an unsigned 450e9 as text; neither names a unit, so both are refused as 450
    is (a review finding: they slipped through)."""
    from simtrain.spec.hardware import load_hardware

    path = hardware_variant(tmp_path, {"intra_node.bandwidth": value})
    with pytest.raises(InputError) as exc:
        load_hardware(str(path), base_dir=tmp_path, file="scenario.yaml")
    assert f"intra_node.bandwidth: {shown} has no unit" in str(exc.value)


def test_python_overrides_take_si_numbers_on_a_file_scenario():
    """A scenario loaded from a file takes SI floats through with_overrides, as Python does everywhere:
    dp_bucket_size 50e6 is 50 MB."""
    from conftest import REPO

    from simtrain.spec.scenario import load_scenario

    sc = load_scenario(REPO / "scenarios/pp4_dp4.yaml").with_overrides({"simulation.dp_bucket_size": 50e6})
    assert sc.simulation.dp_bucket_size == 50e6


def test_a_boolean_is_not_a_quantity_nor_a_curve_point(tmp_path):
    """true is neither a bandwidth nor a point of a measured curve (a review finding: curves took it as 1)."""
    from simtrain.spec.hardware import load_hardware

    for change, says in (({"intra_node.bandwidth": {"value": True, "source": "x"}}, "true is a boolean"),
                         ({"intra_node.busbw_curve": {"value": [[1e6, 0.5], [1e9, True]], "source": "x"}},
                          "is not a [size, fraction] pair")):
        path = hardware_variant(tmp_path, change)
        with pytest.raises(InputError) as exc:
            load_hardware(str(path), base_dir=tmp_path, file="scenario.yaml")
        assert says in str(exc.value)


def test_counts_agree_with_their_number():
    """'1 stage' but '4 stages'; an irregular plural is given ('1 micro-batch', '16 micro-batches')."""
    from simtrain.spec.units import format_count
    assert [format_count(n, "stage") for n in (1, 4)] == ["1 stage", "4 stages"]
    assert format_count(1, "micro-batch", "micro-batches") == "1 micro-batch"
    assert format_count(1600, "micro-batch", "micro-batches") == "1,600 micro-batches"


def test_no_time_is_zero_seconds():
    """An exposed time of exactly 0 reads '0 s', not '0.0 us'; the units still follow the size."""
    from simtrain.spec.units import format_time
    assert [format_time(0.0), format_time(2.5e-6), format_time(1.94e-3), format_time(2.913)] == \
        ["0 s", "2.5 us", "1.94 ms", "2.913 s"]
