"""A number written as text in a scenario or model file is refused, not read as the number.

pydantic's lax mode reads "128", " 128 " and "1_28" as 128 for an int field, and "2.5" as 2.5 for a float; docs/
errors.md lists "text for a number" as a refused type, and the HuggingFace reader refuses such text at its key. The
audit found `training.seq_len: "128"`, `parallel.dp: "2"` and a model's `layers: "4"` running. A field that also
takes a word (`layers_per_stage: auto`) still takes the word, and a quantity with its unit ("100 GB/s") is text by
design.
"""

from __future__ import annotations

import pytest
from conftest import DATA, make_scenario, scenario_dict

from simtrain.spec.errors import InputError


@pytest.mark.parametrize("section, key, value, kind", [
    ("training", "seq_len", "128", "a whole number"),
    ("training", "seq_len", " 128 ", "a whole number"),
    ("training", "global_batch", "1_6", "a whole number"),
    ("parallel", "tp", "1", "a whole number"),
    ("cost", "price_per_gpu_hour", "2.5", "a number"),
])
def test_a_quoted_number_is_refused_at_its_key(section, key, value, kind):
    from simtrain.spec.scenario import scenario_from_dict

    raw = scenario_dict(gpus_per_node=1)
    raw.setdefault(section, {})[key] = value
    with pytest.raises(InputError) as err:
        scenario_from_dict(raw, file="test.yaml", base_dir=DATA)
    assert err.value.field == f"{section}.{key}"
    assert err.value.message == f"{value!r} is text, not {kind} (write the number without quotes)"


def test_a_model_dimension_written_as_text_is_refused():
    model = {"layers": "4", "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100}
    with pytest.raises(InputError) as err:
        make_scenario(model=model)
    assert err.value.field == "model.layers" and "'4' is text, not a whole number" in err.value.message


def test_words_a_number_field_also_takes_still_read():
    """layers_per_stage takes a list of counts or the word auto; an unknown word keeps pydantic's own message."""
    sc = make_scenario(parallel={"pp": 2, "layers_per_stage": "auto"})
    assert sc.parallel.layers_per_stage == "auto"
    with pytest.raises(InputError) as err:
        make_scenario(training={"seq_len": "long"})
    assert "is text, not" not in err.value.message


def _raw(section, key, value):
    from simtrain.spec.scenario import scenario_from_dict

    raw = scenario_dict(gpus_per_node=1, parallel={"pp": 1})
    raw.setdefault(section, {})[key] = value
    return scenario_from_dict(raw, file="test.yaml", base_dir=DATA)


def test_an_exponent_form_yaml_reads_as_text_still_reads_as_a_number():
    """YAML 1.1 reads an unquoted 2e0 (no dot) or 1.5e12 (no exponent sign) as text, so such text is not refused
    as quoted: pydantic reads it as before (review: `--set cost.price_per_gpu_hour=2e0` had become exit 2)."""
    import yaml

    assert yaml.safe_load("x: 2e0")["x"] == "2e0"
    assert _raw("cost", "price_per_gpu_hour", "2e0").cost.price_per_gpu_hour == 2.0


def test_quoted_numbers_in_a_list_are_refused_at_their_place():
    with pytest.raises(InputError) as err:
        make_scenario(model={"layers": 4, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100},
                      parallel={"pp": 2, "layers_per_stage": ["2", "2"]})
    assert err.value.field == "parallel.layers_per_stage.0"
    assert err.value.message == "'2' is text, not a whole number (write the number without quotes)"


@pytest.mark.parametrize("name, refused", [
    ("two\nlines", True), ("tab\there", True), ("esc\x1b[31m", True), ("line\u2028sep", True),
    ("lone\ud800surrogate", True),          # exit 1 (UnicodeEncodeError) in the first mend
    ("pp4\u00a0dp4 \u2014 13B", False),      # a no-break space and an em dash print on one line
    ("thin\u2009space", False), ("emoji \U0001F468\u200d\U0001F4BB", False),   # a zero-width joiner too
])
def test_a_name_is_refused_only_for_what_breaks_its_line(name, refused):
    """Unicode Cc (control), Zl and Zp (line and paragraph separators) break a report's line; other spacing and
    format characters do not (review: str.isprintable refused a no-break space)."""
    from simtrain.spec.scenario import scenario_from_dict

    raw = {**scenario_dict(gpus_per_node=1), "name": name}
    if refused:
        with pytest.raises(InputError, match="holds a control character") as err:
            scenario_from_dict(raw, file="test.yaml", base_dir=DATA)
        assert err.value.field == "name"
    else:
        assert scenario_from_dict(raw, file="test.yaml", base_dir=DATA).name == name
