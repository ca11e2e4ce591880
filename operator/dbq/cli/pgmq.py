"""`dbq pgmq drain`: move a real PGMQ queue's messages into a dbq queue (`dbq.pgmq_drain`)."""

from __future__ import annotations

import click
import psycopg

from dbq.pgmq_drain import drain as drain_queue


@click.group()
def pgmq() -> None:
    """PGMQ's API on dbq's queues (docs: Coming from PGMQ)."""


@pgmq.command("drain")
@click.option("--from", "source_url", required=True, envvar="DBQ_PGMQ_FROM",
              help="The PGMQ database's URL (postgresql://...; or DBQ_PGMQ_FROM).")  # fmt: skip
@click.option("--queue", required=True, help="The PGMQ queue to empty.")
@click.option("--to", "target_url", required=True, envvar="DBQ_PGMQ_TO",
              help="dbq's database: a QueueUser's URL with send on the queue (or DBQ_PGMQ_TO).")  # fmt: skip
@click.option("--to-queue", default=None, help="The dbq queue's spec.pgmq.name (default: --queue).")
@click.option("--batch", default=100, show_default=True, help="Messages moved a round trip.")
@click.option("--visibility", default=30, show_default=True,
              help="Seconds PGMQ hides a batch while it is moved (it comes back should the drain stop).")  # fmt: skip
@click.option("--wait", default=60.0, show_default=True,
              help="Seconds to wait for messages still in flight in PGMQ once none is left to read.")  # fmt: skip
def drain(
    source_url: str,
    queue: str,
    target_url: str,
    to_queue: str | None,
    batch: int,
    visibility: int,
    wait: float,
) -> None:
    """Move every message of PGMQ queue QUEUE into the dbq queue of the same PGMQ name: read with a
    lease, sent to dbq, then deleted from PGMQ, a batch at a time; messages in flight are waited
    for. Switch the producers to dbq first. Exits 1 when messages are left (run it again)."""
    target = to_queue or queue
    try:
        done = drain_queue(source_url, queue, target_url, target, batch, visibility, wait)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    except psycopg.Error as e:
        # The server's message; a client-side error (a bad URL) only by its kind: libpq's text may
        # quote the URL, and so its password.
        said = e.diag.message_primary or f"{type(e).__name__} (check --from and --to)"
        raise click.ClickException(f"drain of PGMQ queue {queue} stopped: {said}") from None
    click.echo(f"moved {done.moved} messages from PGMQ queue {queue} to dbq queue {target}; {done.left} left")
    for msg_id, why in sorted(done.refused.items()):
        click.echo(f"left in PGMQ: message {msg_id}: {why}", err=True)
    if done.refused:
        raise click.ClickException(
            f"{len(done.refused)} messages are too large for dbq queue {target} and stay in PGMQ queue {queue}:"
            " raise the Queue's spec.messages.maxBytes or spec.messages.headerBytes (the drain adds the headers"
            " pgmq-msg-id and pgmq-enqueued-at, about 80 bytes), then run the drain again"
        )
    if done.left:
        raise click.ClickException(
            f"{done.left} messages are still in flight or delayed in PGMQ queue {queue} after {wait:.0f} s:"
            " run the drain again once they are due"
        )


COMMANDS = (pgmq,)
