"""ddsim.values: "an integer" and "a number" as the readers of files, dumps and arguments take them, never a bool."""
import math

import numpy as np
import pytest
import torch

from ddsim.values import is_int, is_integral, is_real


@pytest.mark.parametrize("v, int_, integral, real", [
    (0, True, True, True),
    (-3, True, True, True),
    (2**70, True, True, True),
    (True, False, False, False),
    (False, False, False, False),
    (1.0, False, False, True),
    (math.nan, False, False, True),
    (math.inf, False, False, True),
    (np.int64(3), False, True, False),
    (np.bool_(True), False, False, False),
    (np.float32(1.5), False, False, False),
    ("1", False, False, False),
    (None, False, False, False),
    ([1], False, False, False),
    (torch.tensor(1), False, False, False),
])
def test_each_kind_of_value_is_what_each_reader_takes(v, int_, integral, real):
    assert (is_int(v), is_integral(v), is_real(v)) == (int_, integral, real)


def test_the_readers_refuse_a_bool_where_they_take_an_integer_or_a_number(tmp_path):
    """Three of the readers that take these, each refusing true where 1 would do: a thread count, a gate policy's
    bound and a cost file's figure (one line naming the input, as every bad input)."""
    from ddsim.errors import InputError
    from ddsim.measure.throughput import CostModel
    from ddsim.threads import wanted
    from ddsim.verdict.gate import load_policy

    assert wanted(1) == 1
    with pytest.raises(InputError, match=r"--threads: expected an integer in 1\.\.1024, got True"):
        wanted(True)
    bad = tmp_path / "policy.toml"
    bad.write_text("[rules]\ndecision_flip_rate = true\n")
    with pytest.raises(InputError, match="needs a finite bound >= 0, got True"):
        load_policy(str(bad))
    cost = tmp_path / "cost.json"
    cost.write_text('{"ar_step_us": true, "verify_us": {"16": 1.0}}')
    with pytest.raises(InputError, match=r"not a cost file \(ar_step_us must be a finite number > 0, got True\)"):
        CostModel.from_file(cost)
