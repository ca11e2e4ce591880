"""The provisioned Queues this operator keeps up, and which of them have upkeep due.

One scheduler for the whole fleet instead of a timer per Queue: kopf's handlers feed it every
Queue as its watch sees it (so a restart rebuilds it from the first listing), and each tick
`due` hands out groups of Queues with something due. The Queues of one group share a database
and a schema, so their statistics are read in one statement and their samples written in
another (`dbq.backends.odbc_ring.measure_many`): an idle Queue costs a row in a statement, not
a timer, a connection checkout and a round trip of its own.

No kopf, no Kubernetes client and no database here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dbq.api.models import QueueSpec, queue_name
from dbq.backends import open_backend
from dbq.backends.base import QueueBackend
from dbq.backends.odbc_ring import CatalogDigests
from dbq.connection import ConnectionSettings
from dbq.controller import conditions as cond
from dbq.controller import upkeep
from dbq.controller.autogrow import with_ring_size
from dbq.errors import DbqError, InvalidSpec
from dbq.resource import SecretReader, settings_for

PAUSED = "dbq.dev/paused"


@dataclass
class Tracked:
    """One Queue as last seen (or last written), and what the operator remembers of it."""

    namespace: str
    name: str
    body: dict[str, Any]
    memory: upkeep.Memory
    # Its backend object (no connection is kept), made again when the spec or the Secret changed.
    _backend: tuple[tuple[int | None, int], ConnectionSettings, QueueBackend] | None = None

    @property
    def spec_raw(self) -> dict[str, Any]:
        return dict(self.body.get("spec") or {})

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def generation(self) -> int | None:
        return (self.body.get("metadata") or {}).get("generation")

    def spec(self) -> QueueSpec:
        return self.memory.spec(self.generation, self.spec_raw)

    def queue_name(self) -> str | None:
        """The name of its queue in the database (None while its spec does not parse)."""
        try:
            return queue_name(self.name, self.spec())
        except (DbqError, ValueError):
            return None

    @property
    def paused(self) -> bool:
        annotations = (self.body.get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(PAUSED, "")).lower() == "true"

    def provisioned(self) -> bool:
        """Provisioned and not being deleted."""
        deleting = (self.body.get("metadata") or {}).get("deletionTimestamp")
        return cond.is_true(self.status.get("conditions"), cond.PROVISIONED) and not deleting

    def kept_up(self) -> bool:
        """Whether upkeep is the operator's to do: provisioned, not paused, not being deleted."""
        return self.provisioned() and not self.paused

    def pause_changed(self) -> bool:
        """Paused or resumed (the annotation) since its status said so: a drift check says it."""
        said = cond.condition(self.status.get("conditions"), cond.PAUSED) is not None
        return self.provisioned() and self.paused != said

    def backend(self, read_secret: SecretReader) -> QueueBackend:
        """The Queue's backend object: the Secret is read (its reader caches it) and the
        backend made again only when the spec's generation or the connection changed."""
        spec = with_ring_size(self.spec(), self.status)  # the size autoGrow grew it to
        settings = settings_for(spec, self.namespace, read_secret)
        kept = self._backend
        if kept is None or kept[0] != (self.generation, spec.ring.size) or kept[1] != settings:
            try:
                queue = queue_name(self.name, spec)
            except ValueError as e:
                raise InvalidSpec(str(e)) from None
            kept = self._backend = (
                (self.generation, spec.ring.size),
                settings,
                open_backend(spec, queue, settings),
            )
        return kept[2]


@dataclass(frozen=True)
class Group:
    """Queues with upkeep due that one worker keeps up together, on one connection. `batched`:
    PostgreSQL rings of one schema, whose statistics are read together."""

    key: tuple[str, ...]
    queues: list[Tracked]
    batched: bool


def group_key(namespace: str, name: str, spec: QueueSpec) -> tuple[tuple[str, ...], bool]:
    """The group of a Queue, and whether its group is read in one statement."""
    secret = spec.connection.secret_ref.name
    if spec.backend == "postgres" and spec.design == "ring":
        return (namespace, secret, spec.connection.schema_), True
    return (namespace, secret, spec.connection.schema_, name), False


@dataclass
class Fleet:
    """The Queues kopf's watch saw, by namespace and name (thread-safe)."""

    _queues: dict[tuple[str, str], Tracked] = field(default_factory=dict)
    # Per namespace and Secret (one database): what the Queues of that database share.
    _databases: dict[tuple[str, str], upkeep.DatabaseMemory] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    drift_interval_s: float | None = None  # objects compared with the spec this often (None: never)
    # Per batched group: the catalog digests of its schema's queues last read, and when.
    digests: dict[tuple[str, ...], tuple[CatalogDigests, float]] = field(default_factory=dict)

    def tracked(self, namespace: str, name: str, spec: Mapping[str, Any] | None = None) -> Tracked:
        """The Queue's entry, made on first use (by a handler, before the watch fed it)."""
        with self._lock:
            found = self._queues.get((namespace, name))
            if found is None:
                secret = str(((dict(spec or {}).get("connection") or {}).get("secretRef") or {}).get("name"))
                database = self._databases.setdefault((namespace, secret), upkeep.DatabaseMemory())
                found = self._queues[(namespace, name)] = Tracked(
                    namespace, name, {"metadata": {"namespace": namespace, "name": name}, "spec": dict(spec or {})},
                    upkeep.Memory(database=database),
                )  # fmt: skip
            return found

    def saw(self, body: Mapping[str, Any]) -> None:
        """The Queue as the watch delivered it."""
        metadata = body.get("metadata") or {}
        entry = self.tracked(metadata["namespace"], metadata["name"], body.get("spec"))
        entry.body = {
            "metadata": metadata,
            "spec": body.get("spec") or {},
            "status": body.get("status") or {},
        }

    def wrote(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """A status patch the operator wrote: seen at once, before the watch brings it back."""
        with self._lock:
            entry = self._queues.get((namespace, name))
        if entry is not None:
            entry.body = {**entry.body, "status": {**(entry.body.get("status") or {}), **status}}

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._queues.pop((namespace, name), None)

    def due(self, now: float | None = None, wall: datetime | None = None,
            busy: frozenset[tuple[str, ...]] = frozenset()) -> list[Group]:  # fmt: skip
        """The groups with upkeep due (nothing is opened to decide), leaving out the `busy`
        ones (a worker still runs their last tick). A database whose health check is due gets
        it from one of its queues: one handed out anyway, or one more."""
        now = time.monotonic() if now is None else now
        wall = datetime.now(UTC) if wall is None else wall
        with self._lock:
            entries = list(self._queues.values())
        groups: dict[tuple[str, ...], Group] = {}
        checking: dict[int, tuple[tuple[str, ...], bool, Tracked] | None] = {}  # by database: who checks
        for entry in entries:
            handed = self._hand_out(entry, groups, busy, now, wall)
            database = id(entry.memory.database)
            if handed is not None:
                checking[database] = None
            elif database not in checking and entry.kept_up() and entry.memory.database.check_due(now):
                checking[database] = self._group_of(entry)
        for chosen in checking.values():
            if chosen is not None and chosen[0] not in busy:
                key, batched, entry = chosen
                groups.setdefault(key, Group(key, [], batched)).queues.append(entry)
        return list(groups.values())

    def _hand_out(self, entry: Tracked, groups: dict[tuple[str, ...], Group], busy: frozenset[tuple[str, ...]],
                  now: float, wall: datetime) -> tuple[str, ...] | None:  # fmt: skip
        """The entry put in its group when it has upkeep due and its group is not busy: the key."""
        key: tuple[str, ...]
        if entry.pause_changed():  # a drift check of its own, now
            entry.memory.drift_at = 0.0
            key, batched = (entry.namespace, entry.name), False
        elif not entry.kept_up():
            return None
        else:
            try:
                spec = entry.spec()
            except DbqError:
                spec = None  # its upkeep reports it
            if spec is not None and upkeep.nothing_due(spec, entry.status, entry.memory, now, wall,
                                                       self.drift_interval_s):  # fmt: skip
                return None
            key, batched, _ = self._group_of(entry)
        if key in busy:
            return None
        groups.setdefault(key, Group(key, [], batched)).queues.append(entry)
        return key

    def _group_of(self, entry: Tracked) -> tuple[tuple[str, ...], bool, Tracked]:
        """The entry's group key, whether it is batched, and the entry."""
        try:
            key, batched = group_key(entry.namespace, entry.name, entry.spec())
        except DbqError:
            key, batched = (entry.namespace, entry.name), False
        return key, batched, entry
