"""spec.ring.autoGrow: the size the operator keeps, when it grows, and bad input refused naming
the field (pure: no database, no cluster)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dbq.api.models import QueueSpec
from dbq.controller.autogrow import FULL_SAMPLES, decide, ring_size, with_ring_size
from tests.manifests import queue


def spec(size: int = 1000, **grow: object) -> QueueSpec:
    ring: dict[str, object] = {"size": size}
    if grow:
        ring["autoGrow"] = grow
    return QueueSpec.model_validate({**queue()["spec"], "ring": ring})


def test_the_ring_kept_is_the_spec_s_or_what_auto_grow_grew_it_to():
    grown = {"ring": {"grownTo": 4000}}
    assert ring_size(spec(1000), grown) == 1000  # no autoGrow: back to spec.ring.size
    assert ring_size(spec(1000, maxSize=8000), grown) == 4000
    assert ring_size(spec(5000, maxSize=8000), grown) == 5000  # the spec raised past it
    assert ring_size(spec(1000, maxSize=8000), {}) == 1000
    assert ring_size(spec(1000, maxSize=2000), grown) == 2000  # maxSize lowered since
    kept = with_ring_size(spec(1000, maxSize=8000), grown)
    assert kept.ring.size == 4000 and kept.ring.auto_grow is not None


def test_it_grows_by_its_factor_after_two_samples_above_the_threshold_up_to_max_size():
    s = spec(1000, maxSize=3000, whenFullAbove=80, factor=2)
    first = decide(s, 1000, 801, 0)
    assert (first.full_samples, first.to) == (1, None)  # one sample: a burst
    assert decide(s, 1000, 801, first.full_samples).to == 2000
    assert decide(s, 1000, 800, first.full_samples).full_samples == 0  # not above: counted again
    assert decide(s, 2000, 1900, 1).to == 3000  # capped at maxSize
    at_max = decide(s, 3000, 2900, 1)
    assert at_max.blocked and at_max.to is None
    assert decide(spec(1000), 1000, 1000, 5).to is None  # no autoGrow
    assert FULL_SAMPLES == 2


@pytest.mark.parametrize(
    ("grow", "words"),
    [
        ({"maxSize": 500}, "spec.ring.autoGrow.maxSize (500) is below spec.ring.size (1000)"),
        ({"maxSize": 5000, "whenFullAbove": 0}, "ring.autoGrow.whenFullAbove"),
        ({"maxSize": 5000, "whenFullAbove": 100}, "ring.autoGrow.whenFullAbove"),
        ({"maxSize": 5000, "factor": 1.0}, "ring.autoGrow.factor"),
        ({"maxSize": 20_000_000}, "ring.autoGrow.maxSize"),
        ({"whenFullAbove": 50}, "ring.autoGrow.maxSize"),
    ],
)
def test_bad_auto_grow_is_refused_naming_the_field(grow, words):
    with pytest.raises(ValidationError) as refused:
        spec(1000, **grow)
    assert words in str(refused.value), str(refused.value)


def test_a_sql_server_ring_grows_like_a_postgresql_one():
    on_sqlserver = QueueSpec.model_validate(
        {**queue()["spec"], "backend": "sqlserver", "ring": {"size": 100, "autoGrow": {"maxSize": 200}}}
    )
    assert decide(on_sqlserver, 100, 90, FULL_SAMPLES - 1).to == 200
