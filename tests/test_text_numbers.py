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
