"""`dbq publish`: publish to a topic from a shell.

A topic is named by its Topic resource (`dbq publish orders -n shop`, read with the current
kubeconfig together with its Secret) or by a database URL and the topic's name
(`dbq publish orders --url postgresql://...` or `cassandra://...`, or DBQ_URL in the environment).
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import TYPE_CHECKING

import click

from dbq.cli.data import headers_of
from dbq.client import connect_topic, connect_topic_resource
from dbq.client.waiting import seconds_arg
from dbq.errors import DbqError

if TYPE_CHECKING:
    from dbq.client import AnyTopic


def _opened(
    topic: str, url: str | None, schema: str | None, namespace: str | None, user: str | None = None
) -> AnyTopic:
    if url:
        return connect_topic(url, topic, schema=schema)
    from dbq.kube import current_namespace  # the kubernetes client: the `kube` extra

    return connect_topic_resource(topic, namespace or current_namespace(), user=user)


@click.command()
@click.argument("topic")
@click.argument("messages", nargs=-1)
@click.option("--url", envvar="DBQ_URL", help="Database URL; without it TOPIC is a Topic resource.")
@click.option("--schema", default=None, help="Schema (keyspace) of the topic (with --url; default dbq).")
@click.option("--namespace", "-n", default=None, help="Namespace of the Topic resource.")
@click.option(
    "--user",
    default=None,
    envvar="DBQ_USER",
    help="Publish as this QueueUser (its Secret dbq-user-USER), not with the Topic's Secret (env DBQ_USER).",
)
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text")
@click.option("--subject", "-s", default=None, help="The messages' subject (routing key).")
@click.option(
    "--header", "-H", "header_args", multiple=True, metavar="NAME=VALUE",
    help="A header every message carries (repeat for more); the value is text.",
)  # fmt: skip
@click.option("--ttl", type=float, default=None, help="Seconds until the copies expire unread.")
def publish(
    topic: str,
    messages: tuple[str, ...],
    url: str | None,
    schema: str | None,
    namespace: str | None,
    user: str | None,
    output: str,
    subject: str | None,
    header_args: tuple[str, ...],
    ttl: float | None,
) -> None:
    """Publish MESSAGES (or, with none given, each line of stdin) to TOPIC; prints, for each, the
    subscriptions that got a copy and the copy's id in their queue."""
    headers = headers_of(header_args)
    try:
        seconds_arg(ttl, "--ttl", 0.0)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--ttl") from None
    bodies = [m.encode() for m in messages] or [line.rstrip("\n").encode() for line in sys.stdin]
    try:
        publisher = _opened(topic, url, schema, namespace, user)
    except (DbqError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    try:
        routed = publisher.publish_many(bodies, headers=headers, subjects=subject, ttl=ttl) if bodies else []
    except (ValueError, TypeError) as e:  # a header or subject the topic refuses
        raise click.BadParameter(str(e), param_hint="--header/--subject") from None
    except DbqError as e:
        raise click.ClickException(str(e)) from None
    finally:
        publisher.close()
    if output == "json":
        click.echo(json.dumps({"routed": [{name: str(i) if isinstance(i, uuid.UUID) else i for name, i in copies.items()}
                                          for copies in routed]}))  # fmt: skip
        return
    for copies in routed:
        words = [f"{name or '(unrouted queue)'}={msg_id}" for name, msg_id in sorted(copies.items())]
        click.echo(" ".join(words) or "(unrouted)")


COMMANDS = (publish,)
