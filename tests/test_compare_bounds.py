"""compare's price, token budget and goodput: the same bounds for the option, the Python argument and (for the
price) a scenario file's own cost.price_per_gpu_hour; out of them, exit 2 with one sentence naming the option."""

from __future__ import annotations

import pytest
from conftest import REPO, run_cli

from simtrain.decide.compare import compare
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import load_scenario

PP4 = str(REPO / "scenarios" / "pp4_dp4.yaml")

# docs/errors.md: a plain float (cost.price_per_gpu_hour) is 0 or of magnitude 1e-12 to 1e12, and a price must be
# > 0: so by hand 2.5, 1e-12 and 1e12 are prices; 1e300, 1e13, 1e-13, 0, -1, inf and nan are not
PRICES = [("2.5", True), ("1e-12", True), ("1e12", True), ("1e300", False), ("1e13", False), ("1e-13", False),
          ("0", False), ("-1", False), ("inf", False), ("nan", False)]


@pytest.mark.parametrize("text, taken", PRICES)
def test_price_bound_is_the_scenario_files_own(text, taken):
    """Rule: one bound for a price wherever it is given: a scenario's cost.price_per_gpu_hour and the Python
    argument take the same values (the hand list above)."""
    value = float(text)
    sc = load_scenario(PP4)
    if taken:
        assert load_scenario(PP4, {"cost.price_per_gpu_hour": value}).cost.price_per_gpu_hour == value
        (row,) = compare([sc], tokens=1e9, price_per_gpu_hour=value)
        assert row["price_per_gpu_hour"] == value
        return
    if text not in ("inf", "nan"):          # a scenario file spells those .inf / .nan: refused by the schema too
        with pytest.raises(InputError):
            load_scenario(PP4, {"cost.price_per_gpu_hour": value})
    with pytest.raises(InputError) as err:
        compare([sc], price_per_gpu_hour=value)
    assert err.value.field == "price_per_gpu_hour"
    with pytest.raises(InputError):
        compare([sc], price_per_gpu_hour={"pp4_dp4": value})


@pytest.mark.parametrize("args, says", [
    (["--price", "inf"], "error: --price inf: give USD per GPU-hour, a number from 1e-12 to 1e12 (the range of a "
                         "scenario's cost.price_per_gpu_hour)\n"),
    (["--price", "1e300"], "error: --price 1e300: give USD per GPU-hour, a number from 1e-12 to 1e12 (the range of "
                           "a scenario's cost.price_per_gpu_hour)\n"),
    (["--price", "dgx-h100=inf"], "error: --price dgx-h100=inf: give USD per GPU-hour, a number from 1e-12 to 1e12 "
                                  "(the range of a scenario's cost.price_per_gpu_hour)\n"),
    # goodput: a fraction of wall time, (0, 1], and no smaller than simtrain's smallest fraction (1e-6)
    (["--goodput", "1e-300"], "error: --goodput 1e-300: give the fraction of wall time spent training, in (0, 1] and "
                              "at least 1e-6\n"),
    (["--goodput", "1.5"], "error: --goodput 1.5: give the fraction of wall time spent training, in (0, 1] and at "
                           "least 1e-6\n"),
    (["--tokens", "0.5"], "error: --tokens 0.5: give a token count from 1 to 1e18, e.g. 1T or 300B\n"),
])
def test_cli_compare_refuses_values_outside_the_bounds(capsys, args, says):
    """Rule: bad option values exit 2 with one sentence naming the option, the value and what is allowed."""
    code, stdout, err = run_cli(["compare", PP4, *args], capsys)
    assert (code, stdout, err) == (2, "", says)


@pytest.mark.parametrize("kwargs, says", [
    ({"tokens": 1e300}, "tokens: tokens=1e+300: give a token count from 1 to 1e18, e.g. 1e12 or '300B'"),
    ({"tokens": "2e18"}, "tokens: tokens=2e+18: give a token count from 1 to 1e18, e.g. 1e12 or '300B'"),
    ({"goodput": 1e-7}, "goodput: goodput=1e-07: give the fraction of wall time spent training, in (0, 1] and at "
                        "least 1e-6"),
])
def test_python_compare_takes_the_options_bounds(kwargs, says):
    """The Python API refuses what the options refuse (the CLI took tokens 1 to 1e18 and the API any positive)."""
    with pytest.raises(InputError) as err:
        compare([load_scenario(PP4)], **kwargs)
    assert str(err.value) == says
