"""`dbq push`, `dbq pop` and `dbq stats`: the data plane from a shell.

A queue is named either by a Queue resource (`dbq stats orders -n shop`, read with the current
kubeconfig together with its Secret) or by a database URL and the queue's name
(`dbq stats orders --url postgresql://...`, or DBQ_URL in the environment).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn
from rich.table import Table

from dbq.api.durations import time_or_ago
from dbq.client import (
    BrokerMessage,
    BrokerQueue,
    ConsumeStats,
    Message,
    Queue,
    RateMeter,
    connect,
    connect_resource,
)
from dbq.client.waiting import seconds_arg
from dbq.errors import DbqError

if TYPE_CHECKING:  # pipes need Cassandra's driver, which the lean install leaves out
    from dbq.client import AnyQueue, PipeMessage, PipesQueue

    DeadLettered = Queue | PipesQueue  # the designs that keep dead letters and archives

F = TypeVar("F", bound=Callable[..., Any])


def _remember_user(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """--user, kept for `opened` (every command takes it; none reads it itself)."""
    ctx.meta["dbq.user"] = value


def target_options(f: F) -> F:
    for option in reversed(
        [
            click.argument("queue"),
            click.option(
                "--url", envvar="DBQ_URL", help="Database URL; without it QUEUE is a Queue resource."
            ),
            click.option("--schema", default=None, help="Schema of the queue (with --url; default dbq)."),
            click.option(
                "--design",
                type=click.Choice(["ring", "servicebroker", "pipes"]),
                default=None,
                help="With --url: the queue's design, when the url's backend has several (sqlserver).",
            ),
            click.option("--namespace", "-n", default=None, help="Namespace of the Queue resource."),
            click.option(
                "--user",
                default=None,
                envvar="DBQ_USER",
                expose_value=False,
                callback=_remember_user,
                help="Connect as this QueueUser (its Secret dbq-user-USER), not with the Queue's Secret (env DBQ_USER).",
            ),
            click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text"),
        ]
    ):
        f = option(f)
    return f


@contextmanager
def opened(
    queue: str, url: str | None, schema: str | None, namespace: str | None, design: str | None = None
) -> Iterator[AnyQueue]:
    try:
        if url:
            q = connect(url, queue, schema=schema, design=design)
        else:
            from dbq.kube import current_namespace  # the kubernetes client: the `kube` extra

            user = click.get_current_context().meta.get("dbq.user")
            q = connect_resource(queue, namespace or current_namespace(), user=user)
    except (DbqError, ValueError) as e:  # each names what to fix: a missing Secret, a bad spec
        raise click.ClickException(str(e)) from None
    try:
        yield q
    except DbqError as e:
        raise click.ClickException(str(e)) from None
    finally:
        q.close()


@click.command()
@target_options
@click.argument("messages", nargs=-1)
@click.option("--ttl", type=float, default=None, help="Seconds until the messages expire unread.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait while the queue is full.")
@click.option(
    "--header", "-H", "header_args", multiple=True, metavar="NAME=VALUE",
    help="A header every message carries (repeat for more); the value is text.",
)  # fmt: skip
def push(
    queue: str,
    url: str | None,
    schema: str | None,
    design: str | None,
    namespace: str | None,
    output: str,
    messages: tuple[str, ...],
    ttl: float | None,
    timeout: float | None,
    header_args: tuple[str, ...],
) -> None:
    """Push MESSAGES (or, with none given, each line of stdin) to QUEUE; prints their ids."""
    headers = headers_of(header_args)
    for hint, seconds in (("--ttl", ttl), ("--timeout", timeout)):
        try:
            seconds_arg(seconds, hint, 0.0)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=hint) from None
    bodies = [m.encode() for m in messages] or [line.rstrip("\n").encode() for line in sys.stdin]
    with opened(queue, url, schema, namespace, design) as q:
        try:
            ids = q.push_many(bodies, timeout=timeout, ttl=ttl, headers=headers) if bodies else []
        except (ValueError, TypeError) as e:  # the rest was checked: a header the queue refuses
            raise click.BadParameter(str(e), param_hint="--header") from None
    click.echo(json.dumps({"ids": ids}, default=str) if output == "json" else "\n".join(map(str, ids)))


@click.command()
@target_options
@click.option("--count", "-c", default=1, show_default=True, help="Pop up to this many messages.")
@click.option("--timeout", type=float, default=0.0, show_default=True, help="Seconds to wait for one.")
@click.option(
    "--show-headers", is_flag=True,
    help="Print each message as its headers (JSON, {} for none), a tab, then the body.",
)  # fmt: skip
def pop(
    queue: str,
    url: str | None,
    schema: str | None,
    design: str | None,
    namespace: str | None,
    output: str,
    count: int,
    timeout: float,
    show_headers: bool,
) -> None:
    """Pop up to COUNT messages from QUEUE (at-most-once: they are gone) and print their bodies,
    one per line (-o json: with ids, attempts and headers)."""
    if count < 1:
        raise click.BadParameter("must be at least 1", param_hint="--count")
    with opened(queue, url, schema, namespace, design) as q:
        got = q.pop_many(count, timeout=timeout)
    if output == "json":
        click.echo(json.dumps([_message_json(m) for m in got]))
    else:
        for m in got:
            body = m.body.decode(errors="backslashreplace")
            click.echo(f"{json.dumps(m.headers, sort_keys=True)}\t{body}" if show_headers else body)
    if not got:
        sys.exit(3)  # like `grep`: nothing found is not an error, but scripts can tell


def _message_json(m: Message | PipeMessage | BrokerMessage) -> dict[str, Any]:
    return {"id": _id_json(m.id), "attempts": m.attempts, "headers": dict(m.headers), **_body_json(m.body)}


def headers_of(args: tuple[str, ...]) -> dict[str, str] | None:
    """`--header NAME=VALUE` options as a mapping (None for none)."""
    headers: dict[str, str] = {}
    for arg in args:
        name, equals, value = arg.partition("=")
        if not equals or not name:
            raise click.BadParameter(f"{arg!r} is not NAME=VALUE (e.g. content-type=application/json)",
                                     param_hint="--header")  # fmt: skip
        headers[name] = value
    return headers or None


@click.command()
@target_options
@click.option(
    "--watch",
    "-w",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Print a line every SECONDS, with push and take rates, until interrupted.",
)
@click.option("--samples", type=int, default=0, help="With --watch: stop after this many lines.")
def stats(
    queue: str,
    url: str | None,
    schema: str | None,
    design: str | None,
    namespace: str | None,
    output: str,
    watch: float | None,
    samples: int,
) -> None:
    """Depth, in-flight, totals and the oldest message's age of QUEUE."""
    with opened(queue, url, schema, namespace, design) as q:
        if watch is not None:
            _watch(q, watch, samples, output)
            return
        s = q.stats()
        where = f"{q.settings.endpoint} {q.names.schema}.{q.names.queue}"
        # A ring's capacity, or how many pipes a pipes queue has open (a Service Broker queue has neither).
        size: tuple[str, str, int] | None = (
            ("ringSize", "RING SIZE", q.size)
            if isinstance(q, Queue)
            else ("openPipes", "OPEN PIPES", len(getattr(s, "pipes", ())))
            if not isinstance(q, BrokerQueue)
            else None
        )
    if output == "json":
        sized = {size[0]: size[2]} if size else {}
        click.echo(json.dumps({"queue": q.names.queue, **sized, **_camel(s.as_dict())}, default=str))
        return
    table = Table(title=f"queue {where}", title_justify="left")
    columns = ["DEPTH", "IN FLIGHT", *([size[1]] if size else []), "PUSHED", "POPPED", "ACQUIRED", "EXPIRED"]
    for column in (*columns, "OLDEST"):
        table.add_column(column, justify="right")
    figures = [s.depth, s.in_flight, *([size[2]] if size else []), s.pushed, s.popped, s.acquired, s.expired]
    table.add_row(*(f"{v:,}" for v in figures), f"{s.oldest_age_seconds:.1f}s")
    Console().print(table)


def _watch(q: AnyQueue, every: float, samples: int, output: str) -> None:
    """One line per sample; rates over the last minute of samples."""
    meter = RateMeter(window=60)
    if output != "json":
        click.echo(
            f"{'TIME':8} {'DEPTH':>10} {'IN FLIGHT':>9} {'PUSHED':>12} {'TAKEN':>12} {'PUSH/S':>9} {'TAKE/S':>9}"
        )
    n = 0
    while True:
        s = q.stats()
        taken = s.popped + s.acquired
        meter.add(time.time(), s.pushed, taken)
        push_rate, take_rate = meter.rates() or (0.0, 0.0)
        if output == "json":
            click.echo(json.dumps({"time": time.time(), "depth": s.depth, "inFlight": s.in_flight, "pushed": s.pushed,
                                   "taken": taken, "pushRate": push_rate, "takeRate": take_rate}))  # fmt: skip
        else:
            click.echo(f"{time.strftime('%H:%M:%S')} {s.depth:10,} {s.in_flight:9,} {s.pushed:12,} {taken:12,}"
                       f" {push_rate:9,.1f} {take_rate:9,.1f}")  # fmt: skip
        n += 1
        if samples and n >= samples:
            return
        time.sleep(every)


def _camel(values: dict[str, Any]) -> dict[str, Any]:
    def camel(key: str) -> str:
        head, *rest = key.split("_")
        return head + "".join(w.title() for w in rest)

    return {camel(k): v for k, v in values.items()}


@click.group()
def broker() -> None:
    """Service Broker queues (SQL Server)."""


@broker.command()
@target_options
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Seconds to wait for the token.")
def trace(
    queue: str,
    url: str | None,
    schema: str | None,
    design: str | None,
    namespace: str | None,
    output: str,
    timeout: float,
) -> None:
    """Send a tracer token through QUEUE's services and print how long it took to arrive."""
    with opened(queue, url, schema, namespace, design or "servicebroker") as q:
        if not isinstance(q, BrokerQueue):
            raise click.ClickException(f"{queue} is not a Service Broker queue: a tracer token needs one")
        ms = q.trace(timeout)
    if output == "json":
        click.echo(json.dumps({"queue": q.names.queue, "delivered": True, "milliseconds": ms}))
    else:
        click.echo(f"tracer token delivered through {q.names.schema}.{q.names.queue} in {ms:.0f} ms")


@click.command(context_settings={"ignore_unknown_options": True})
@target_options
@click.option("--concurrency", "-c", default=1, show_default=True, help="Commands running at once.")
@click.option("--credit", type=int, default=None, help="Most messages held at once (default: --concurrency).")
@click.option(
    "--visibility", type=float, default=None, help="Seconds each message is leased (default: the queue's)."
)
@click.option("--max-messages", type=int, default=None, help="Stop after this many messages.")
@click.option(
    "--grace",
    type=float,
    default=None,
    help="Seconds running commands get after SIGTERM before they are abandoned (default: no limit);"
    " in a pod, a few seconds under terminationGracePeriodSeconds.",
)
@click.option(
    "--at-most-once",
    is_flag=True,
    help="Pop instead of acquiring: a message is gone once taken, and a failed command loses it.",
)
@click.option(
    "--until-empty",
    is_flag=True,
    help="Exit once the queue has nothing to take and the running commands finished: a Job's consumer.",
)
@click.argument("command", nargs=-1, required=True)
def consume(
    queue: str,
    url: str | None,
    schema: str | None,
    design: str | None,
    namespace: str | None,
    output: str,
    concurrency: int,
    credit: int | None,
    visibility: float | None,
    max_messages: int | None,
    grace: float | None,
    at_most_once: bool,
    until_empty: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (after --) for each message of QUEUE, with the body on its stdin: exit 0 acks
    it; anything else nacks it with backoff, its stderr the error (a ring queue with
    spec.deadLetter dead-letters it after maxAttempts). SIGTERM or Ctrl-C stops gracefully:
    messages not started go back at once, running commands finish (within --grace: past it they
    are abandoned, and their messages come back when their leases end). With --at-most-once,
    taking stops first and every message taken is handled."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def run(message: Any) -> None:
        done = subprocess.run(list(command), input=message.body, capture_output=True, check=False)
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-500:]
            raise CommandFailed(f"{command[0]} exited {done.returncode}: {tail}")

    console = Console(stderr=True)
    quiet = output == "json" or not console.is_terminal
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), console=console, disable=quiet)
    with opened(queue, url, schema, namespace, design) as q, progress:
        task = progress.add_task(f"consuming {queue}")

        def report(s: ConsumeStats) -> None:
            words = f"{s.handled:,} handled, {s.failed:,} failed, {s.dead_lettered:,} dead-lettered"
            progress.update(task, description=f"consuming {queue}: {words}")

        try:
            result = q.consume(run, concurrency=concurrency, credit=credit, visibility=visibility, stop=stop,
                               max_messages=max_messages, on_progress=report, grace=grace,
                               at_most_once=at_most_once, until_empty=until_empty)  # fmt: skip
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    summary = {"handled": result.handled, "failed": result.failed, "deadLettered": result.dead_lettered,
               "returned": result.returned, "abandoned": result.abandoned, "lostLeases": result.lost_leases,
               "mostInHand": result.most_in_hand}  # fmt: skip
    click.echo(json.dumps(summary) if output == "json" else ", ".join(f"{k} {v}" for k, v in summary.items()))


class CommandFailed(Exception):
    """The consumer's command exited non-zero: the message is nacked with this text."""


@click.group("dead-letters")
def dead_letters() -> None:
    """The dead letters of a ring or pipes queue with spec.deadLetter."""


def _keeping(q: AnyQueue, queue: str, what: str = "dead letters") -> DeadLettered:
    if isinstance(q, BrokerQueue):
        raise click.ClickException(f"{queue} is a Service Broker queue: it keeps no {what}")
    return q


def _ids(q: DeadLettered, given: tuple[str, ...]) -> list[Any] | None:
    """--id values as the design's ids (whole numbers on the ring, UUIDs on pipes); None: all."""
    try:
        return [int(i) if isinstance(q, Queue) else uuid.UUID(i) for i in given] or None
    except ValueError:
        kind = "a whole number" if isinstance(q, Queue) else "a UUID"
        raise click.BadParameter(
            f"each id is {kind} (as `dead-letters list` shows it)", param_hint="--id"
        ) from None


@dead_letters.command("list")
@target_options
@click.option("--limit", default=100, show_default=True, help="At most this many, oldest first.")
@click.option(
    "--held", is_flag=True,
    help="Instead: every dead letter QUEUE's table keeps, also other queues' (their spec.deadLetter.queue).",
)  # fmt: skip
def dead_letters_list(
    queue: str, url: str | None, schema: str | None, design: str | None, namespace: str | None, output: str,
    limit: int, held: bool,
) -> None:  # fmt: skip
    """The dead letters of QUEUE (wherever they are kept): id, attempts, last error, when pushed
    and dead-lettered, and the queue they came from."""
    with opened(queue, url, schema, namespace, design) as q:
        letters = _keeping(q, queue).dead_letters(limit, held=held)
    if output == "json":
        click.echo(json.dumps([{"id": _id_json(d.id), "attempts": d.attempts,
                                "error": d.error, "pushedAt": d.pushed_at, "deadAt": d.dead_at,
                                "source": d.source, "headers": dict(d.headers), **_body_json(d.body)}
                               for d in letters]))  # fmt: skip
        return
    title = f"dead letters {'held by' if held else 'of'} {queue}"
    table = Table(title=title, title_justify="left")
    for column in ("ID", "ATTEMPTS", "DEAD AT (UTC)", "ERROR", "SOURCE", "HEADERS", "BODY"):
        table.add_column(column)
    for d in letters:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(d.dead_at))
        body = d.body[:60].decode(errors="backslashreplace")
        table.add_row(str(d.id), str(d.attempts), at, d.error or "", d.source, _headers_text(d.headers), body)
    Console().print(table)


def _moving(name: str, done: str, doc: str, move: Callable[[DeadLettered, list[Any] | None], int]) -> None:
    """`dbq dead-letters NAME QUEUE [--id N ...]`: `move` the named dead letters, or all."""

    @dead_letters.command(name, help=doc)
    @target_options
    @click.option("--id", "ids", multiple=True, help=f"A dead letter to {name} (repeat); default: all.")
    def command(
        queue: str, url: str | None, schema: str | None, design: str | None, namespace: str | None, output: str,
        ids: tuple[str, ...],
    ) -> None:  # fmt: skip
        with opened(queue, url, schema, namespace, design) as q:
            keeping = _keeping(q, queue)
            wanted = _ids(keeping, ids)
            n = _each_batch(lambda: move(keeping, wanted), bool(ids))
        click.echo(json.dumps({done: n}) if output == "json" else f"{n} dead letters {done}")


_moving("redrive", "redriven", "Move dead letters of QUEUE back to delivery: same ids, attempts from zero.",
        lambda q, ids: q.redrive(ids))  # fmt: skip
_moving("purge", "purged", "Delete dead letters of QUEUE for good.", lambda q, ids: q.purge_dead_letters(ids))


@click.command("archive")
@target_options
@click.option(
    "--since", default="1h", show_default=True,
    help="Messages acked or popped this long ago or later (a duration: 30m, 24h) or since a UTC time"
    " (2026-11-24T08:00:00).",
)  # fmt: skip
@click.option("--limit", default=100, show_default=True, help="At most this many, oldest first.")
def archive(
    queue: str, url: str | None, schema: str | None, design: str | None, namespace: str | None, output: str,
    since: str, limit: int,
) -> None:  # fmt: skip
    """The archived messages of a queue with spec.archive: id, attempts, when pushed and acked."""
    start = _since(since)
    with opened(queue, url, schema, namespace, design) as q:
        kept = _keeping(q, queue, "archive").archived(start, limit)
    if output == "json":
        click.echo(json.dumps([{"id": _id_json(m.id), "attempts": m.attempts, "pushedAt": m.pushed_at,
                                "ackedAt": m.acked_at, "headers": dict(m.headers), **_body_json(m.body)}
                               for m in kept]))  # fmt: skip
        return
    table = Table(title=f"archive of {queue} since {start:%Y-%m-%d %H:%M:%S} UTC", title_justify="left")
    for column in ("ID", "ATTEMPTS", "PUSHED AT (UTC)", "ACKED AT (UTC)", "HEADERS", "BODY"):
        table.add_column(column)
    for m in kept:
        pushed, acked = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) for t in (m.pushed_at, m.acked_at)
        )
        table.add_row(
            str(m.id), str(m.attempts), pushed, acked, _headers_text(m.headers),
            m.body[:60].decode(errors="backslashreplace"),
        )  # fmt: skip
    Console().print(table)


def _since(text: str) -> datetime:
    """--since: a duration back from now, or a time (UTC when it names no zone)."""
    try:
        return time_or_ago(text, datetime.now(UTC))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration (30m, 24h) nor a time (2026-11-24T08:00:00)",
            param_hint="--since",
        ) from None


def _each_batch(step: Callable[[], int], once: bool) -> int:
    """Run a bounded step until it does nothing (all), or once (named ids); the total."""
    total = 0
    while True:
        n = step()
        total += n
        if once or n == 0:
            return total


def _id_json(msg_id: object) -> int | str:
    """A message id as JSON: a ring's whole number as it is, a pipes or broker UUID as text."""
    return msg_id if isinstance(msg_id, int) else str(msg_id)


def _body_json(body: bytes) -> dict[str, str]:
    """A body as JSON: text when it is UTF-8, else base64."""
    try:
        return {"body": body.decode()}
    except UnicodeDecodeError:
        return {"bodyBase64": base64.b64encode(body).decode()}


COMMANDS = (push, pop, stats, broker, consume, dead_letters, archive)


def _headers_text(headers: Mapping[str, object]) -> str:
    """Headers in a table cell: name=value, comma-separated (at most 80 characters)."""
    text = ", ".join(f"{k}={v}" for k, v in sorted(headers.items()))
    return text if len(text) <= 80 else text[:79] + "…"
