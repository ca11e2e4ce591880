"""The Queue API models, durations and the generated CRD (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dbq.api.crd import crd, crd_yaml
from dbq.api.durations import format_duration, parse_duration
from dbq.api.models import QueueResource, QueueSpec, queue_name
from tests.manifests import REFUSED_AT_ADMISSION, queue

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_fill_a_minimal_spec():
    spec = QueueSpec.model_validate(queue()["spec"])
    assert spec.ring.size == 64 and spec.ring.message_bytes == 300
    assert spec.timeouts.visibility == "30s" and spec.timeouts.message_ttl == "0s"
    assert spec.deletion_policy == "DeleteIfEmpty"
    assert spec.reindex.schedule == "0 3 * * *"
    dumped = spec.model_dump(by_alias=True)
    assert dumped["timeouts"]["messageTTL"] == "0s" and dumped["deletionPolicy"] == "DeleteIfEmpty"


@pytest.mark.parametrize(
    ("text", "secs"), [("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h30m", 5400), ("24h", 86400)]
)
def test_durations_parse_like_go(text, secs):
    assert parse_duration(text).total_seconds() == secs
    assert parse_duration(format_duration(secs)).total_seconds() == secs


@pytest.mark.parametrize("text", ["", "5", "5d", "1 h", "-5s", "s"])
def test_bad_durations_name_the_accepted_form(text):
    with pytest.raises(ValueError, match="write it like"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("case", "doc", "words"), REFUSED_AT_ADMISSION, ids=[c[0] for c in REFUSED_AT_ADMISSION]
)
def test_models_refuse_what_admission_refuses(case, doc, words):
    with pytest.raises(ValidationError):
        QueueResource.model_validate(doc)


def test_cron_fields_are_checked_and_named():
    with pytest.raises(ValidationError, match="the minute field '61' of '61 25 \\* \\* \\*' must be 0-59"):
        QueueSpec.model_validate({**queue()["spec"], "reindex": {"schedule": "61 25 * * *"}})
    with pytest.raises(ValidationError, match="has 4 fields, not five"):
        QueueSpec.model_validate({**queue()["spec"], "reindex": {"schedule": "0 3 * *"}})
    for good in ("*/15 * * * *", "0 3 * * MON-FRI", "0,30 8-18/2 * jan,jul *", "@daily", "0 3 L * *"):
        assert QueueSpec.model_validate({**queue()["spec"], "reindex": {"schedule": good}})


def test_queue_name_derivation():
    spec = QueueSpec.model_validate(queue()["spec"])
    assert queue_name("order-events", spec) == "order_events"
    assert queue_name("x", QueueSpec.model_validate({**queue()["spec"], "queueName": "named"})) == "named"
    with pytest.raises(ValueError, match=r"set spec\.queueName"):
        queue_name("Orders", spec)


@pytest.mark.parametrize("kind", ["queue", "topic", "subscription"])
def test_crd_file_is_generated_from_the_models(kind):
    on_disk = (ROOT / "crds" / f"{kind}.yaml").read_text()
    assert on_disk == crd_yaml(kind), f"crds/{kind}.yaml is stale: run `dbq crd {kind} > crds/{kind}.yaml`"


def test_crd_is_structural_and_carries_the_admission_rules():
    doc = crd()
    version = doc["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    text = yaml.safe_dump(spec)
    assert "$ref" not in text and "anyOf" not in text and "title" not in text
    assert spec["properties"]["backend"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert spec["required"] == ["backend", "design", "connection"]
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {
        "Backend",
        "Design",
        "Ready",
        "Depth",
        "Push/s",
        "Pop/s",
        "Age",
    }
    assert doc["spec"]["names"]["shortNames"] == ["dbq"]
    assert version["subresources"] == {"status": {}}


def test_the_topic_example_is_valid_for_the_models():
    from dbq.api.topics import SubscriptionResource, TopicResource, subscription_name, topic_name

    docs = list(yaml.safe_load_all((ROOT / "manifests" / "examples" / "topic-orders.yaml").read_text()))
    kinds = {"Topic": TopicResource, "Subscription": SubscriptionResource, "Queue": QueueResource}
    parsed = [kinds[d["kind"]].model_validate(d) for d in docs]
    topics = [p for p in parsed if isinstance(p, TopicResource)]
    subscriptions = [p for p in parsed if isinstance(p, SubscriptionResource)]
    queues = {p.name for p in parsed if isinstance(p, QueueResource)}
    assert [topic_name(t.metadata["name"], t.spec) for t in topics] == ["orders"]
    assert {s.spec.queue for s in subscriptions} | {topics[0].spec.unrouted_queue} == queues
    assert {subscription_name(s.metadata["name"]) for s in subscriptions} == {"eu_fulfilment", "fraud_review"}
