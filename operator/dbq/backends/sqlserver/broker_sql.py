"""All T-SQL of a Service Broker queue: the catalog observation, DDL per planning step, cleanup,
maintenance, teardown, and the data plane's statements.

One queue is: two message types (messages, tracer tokens), a contract, the queue and the
sender's queue, their two services, and four total sequences. Message types, contract and
services are database-wide, so their names carry schema and queue (`QueueNames.broker`,
`dbq/<schema>/<queue>[/part]`); the queues live in the schema. The schema, metadata and
statistics history tables are shared with ring queues, so their statements come from `MsRing`.

Names are validated and bracket-quoted (`ms_quote`, `ms_broker_quote`) or written as validated
literals; numbers are validated integers; values are bound parameters (`?`). No Python parser
reads SEND, RECEIVE, CREATE QUEUE or END CONVERSATION: golden files hold this text, and the
live tests run it whenever DBQ_MSSQL_DSN names a server.
"""

from __future__ import annotations

from dbq.backends.broker_plan import BrokerAction, BrokerStep, BrokerTarget
from dbq.backends.sqlserver.server import MAJOR_VERSION
from dbq.backends.sqlserver.sql import MsRing
from dbq.contract.access import Right
from dbq.contract.broker import (
    BROKER_COUNTERS,
    BROKER_SCHEMA_VERSION,
    DIALOG_LIFETIME_S,
    BrokerStatements,
    each_conversation,
)
from dbq.contract.ring import RingTarget
from dbq.names import check_identifier, ms_broker_quote, ms_literal, ms_quote


class BrokerSql(BrokerStatements):
    """The data plane's statements (`BrokerStatements`), and the operator's."""

    def __init__(self, target: BrokerTarget) -> None:
        super().__init__(target.names)
        self.t = target
        # The schema, metadata and history statements ring queues use (the ring settings are unused).
        self.shared = MsRing(RingTarget(target.names, size=16, message_bytes=16, database=target.database))

    # --- observation: one batch, ten result sets (read in this order by `ServiceBrokerQueue.observe`)
    def observe(self) -> str:
        n, t = self.t.names, self.t
        schema = ms_literal(n.schema)
        queues = f"{ms_literal(n.queue)}, {ms_literal(n.sender_queue)}"
        counters = ", ".join(ms_literal(n.counter(c)) for c in BROKER_COUNTERS)
        tables = f"{ms_literal(n.meta)}, {ms_literal(n.history)}"
        return f"""SET NOCOUNT ON;
SELECT d.is_broker_enabled, CAST(d.service_broker_guid AS nvarchar(36)),
  CASE WHEN EXISTS (SELECT 1 FROM sys.databases o WHERE o.service_broker_guid = d.service_broker_guid
    AND o.database_id <> d.database_id) THEN 1 ELSE 0 END,
  d.is_trustworthy_on,
  {MAJOR_VERSION},
  CASE WHEN SCHEMA_ID({schema}) IS NULL THEN 0 ELSE 1 END,
  d.compatibility_level,
  {self._procedure_exists()}
FROM sys.databases d WHERE d.database_id = DB_ID();
SELECT name FROM sys.service_message_types WHERE name IN ({self._lit(t.message_types[0])}, {self._lit(t.message_types[1])});
SELECT c.name, mt.name FROM sys.service_contracts c
  LEFT JOIN sys.service_contract_message_usages u ON u.service_contract_id = c.service_contract_id
  LEFT JOIN sys.service_message_types mt ON mt.message_type_id = u.message_type_id
WHERE c.name = {self._lit(t.contract)};
SELECT q.name, q.is_receive_enabled, q.is_enqueue_enabled, q.is_activation_enabled, q.activation_procedure,
  CASE WHEN q.activation_procedure IS NULL OR OBJECT_ID(q.activation_procedure) IS NOT NULL THEN 1 ELSE 0 END,
  q.max_readers,
  CASE q.execute_as_principal_id WHEN -2 THEN N'OWNER' ELSE USER_NAME(q.execute_as_principal_id) END,
  q.is_poison_message_handling_enabled, it.name,
  (SELECT ISNULL(SUM(p.rows), 0) FROM sys.partitions p WHERE p.object_id = it.object_id AND p.index_id = 1)
FROM sys.service_queues q LEFT JOIN sys.internal_tables it ON it.parent_object_id = q.object_id
WHERE q.schema_id = SCHEMA_ID({schema}) AND q.name IN ({queues});
SELECT s.name, q.name,
  CASE WHEN EXISTS (SELECT 1 FROM sys.service_contract_usages cu JOIN sys.service_contracts c
    ON c.service_contract_id = cu.service_contract_id
    WHERE cu.service_id = s.service_id AND c.name = {self._lit(t.contract)}) THEN 1 ELSE 0 END
FROM sys.services s JOIN sys.service_queues q ON q.object_id = s.service_queue_id
WHERE s.name IN ({self.services_list});
SELECT o.name FROM sys.objects o WHERE o.schema_id = SCHEMA_ID({schema})
  AND ((o.type = 'SO' AND o.name IN ({counters})) OR (o.type = 'U' AND o.name IN ({tables})));
IF OBJECT_ID({self._object(self.shared.meta)}, N'U') IS NOT NULL
BEGIN
  EXEC sys.sp_executesql N'SELECT schema_version FROM {self.shared.meta} WHERE queue = @queue',
    N'@queue nvarchar(128)', @queue = {ms_literal(n.queue)};
END
ELSE SELECT CAST(NULL AS int) WHERE 1 = 0;
SELECT ce.state, COUNT_BIG(*) FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id
WHERE s.name IN ({self.services_list}) GROUP BY ce.state;
SELECT TOP (10) tq.to_service_name, tq.transmission_status, DATEDIFF_BIG(second, tq.enqueue_time, GETUTCDATE()),
  COUNT_BIG(*) OVER ()
FROM sys.transmission_queue tq
WHERE tq.from_service_name IN ({self.services_list}) OR tq.to_service_name IN ({self.services_list})
ORDER BY CASE WHEN tq.transmission_status = N'' THEN 1 ELSE 0 END, tq.enqueue_time;
IF HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') = 1
BEGIN
  SELECT m.state, DATEDIFF_BIG(second, m.last_activated_time, GETUTCDATE()), m.tasks_waiting, 1
  FROM sys.dm_broker_queue_monitors m
  WHERE m.database_id = DB_ID() AND m.queue_id = OBJECT_ID({self._object(self.queue)});
END
ELSE SELECT N'', 0, 0, 0;"""

    # --- provisioning: one method per planning step --------------------------------------------
    def render(self, step: BrokerStep) -> list[str]:
        a = BrokerAction
        statements = {
            a.ENABLE_BROKER: lambda: ["ALTER DATABASE CURRENT SET ENABLE_BROKER WITH NO_WAIT"],
            a.NEW_BROKER: lambda: ["ALTER DATABASE CURRENT SET NEW_BROKER WITH ROLLBACK IMMEDIATE"],
            a.SET_TRUSTWORTHY: lambda: ["ALTER DATABASE CURRENT SET TRUSTWORTHY ON"],
            a.CREATE_SCHEMA: self.shared.create_schema,
            a.CREATE_META: self.shared.create_meta,
            a.CREATE_HISTORY: self.shared.create_history,
            a.CREATE_SEQUENCES: self.create_sequences,
            a.CREATE_MESSAGE_TYPES: self.create_message_types,
            a.CREATE_CONTRACT: self.create_contract,
            a.CREATE_QUEUE: self.create_queue,
            a.CREATE_SENDER_QUEUE: self.create_sender_queue,
            a.ALTER_QUEUE: self.alter_queue,
            a.ENABLE_QUEUE: lambda: [f"ALTER QUEUE {self.queue} WITH STATUS = ON"],
            a.CREATE_SERVICES: self.create_services,
            a.RECORD_VERSION: self.record_version,
            a.SECURE: self.secure,
        }
        return statements[step.action]()

    def secure(self) -> list[str]:
        """The ring's owner role owns the schema (the queues' too: they are schema objects), and
        each right's database role gets what its calls need: send begins dialogs from the sender's
        service (RECEIVE on its queue, REFERENCES on the contract) and sends to the queue's service;
        receive and peek read the queue; monitor and manage read its metadata and history."""
        shared = self.shared
        owner, groups = ms_quote(shared.owner), {r: ms_quote(g) for r, g in shared.groups.items()}
        everyone = ", ".join(groups.values())
        return [
            *shared.create_roles(),
            f"ALTER AUTHORIZATION ON SCHEMA::{shared.schema} TO {owner}",
            f"GRANT SEND ON SERVICE::{self.service} TO {groups[Right.SEND]}",
            f"GRANT RECEIVE ON {self.sender_queue} TO {groups[Right.SEND]}",
            f"GRANT REFERENCES ON CONTRACT::{self.contract} TO {groups[Right.SEND]}",
            f"GRANT RECEIVE ON {self.queue} TO {groups[Right.RECEIVE]}",
            f"GRANT SELECT ON {self.queue} TO {groups[Right.PEEK]}",
            f"GRANT SELECT ON OBJECT::{shared.meta} TO {everyone}",
            f"GRANT SELECT ON OBJECT::{shared.history} TO {groups[Right.MONITOR]}",
        ]

    def create_sequences(self) -> list[str]:
        return [
            f"IF OBJECT_ID({self._object(seq)}, N'SO') IS NULL\n"
            f"CREATE SEQUENCE {seq} AS bigint START WITH 1 INCREMENT BY 1 MINVALUE 1 CACHE 1000"
            for seq in self.count.values()
        ]

    def create_message_types(self) -> list[str]:
        return [
            f"IF NOT EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = {self._lit(name)})\n"
            f"CREATE MESSAGE TYPE {ms_broker_quote(name)} VALIDATION = NONE"
            for name in self.t.message_types
        ]

    def create_contract(self) -> list[str]:
        return [
            f"IF NOT EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = {self._lit(self.t.contract)})\n"
            f"CREATE CONTRACT {self.contract} ({self.message_type} SENT BY INITIATOR,"
            f" {self.tracer_type} SENT BY INITIATOR)"
        ]

    def _procedure(self) -> str:
        """The activation procedure, schema-qualified and quoted (spec.serviceBroker.activation)."""
        name = check_identifier(str(self.t.activation_procedure), "spec.serviceBroker.activation.procedure")
        return f"{self.schema}.{ms_quote(name)}"

    def _procedure_exists(self) -> str:
        """1 when the spec's activation procedure exists (or none is asked for), else 0."""
        if self.t.activation_procedure is None:
            return "1"
        return f"CASE WHEN OBJECT_ID({self._object(self._procedure())}, N'P') IS NULL THEN 0 ELSE 1 END"

    def _activation(self) -> str:
        t = self.t
        if t.activation_procedure is None:
            return ""
        proc = self._procedure()
        who = (
            t.execute_as
            if t.execute_as in ("OWNER", "SELF")
            else f"'{check_identifier(t.execute_as, 'spec.serviceBroker.activation.executeAs')}'"
        )
        status = "ON" if t.activation_enabled else "OFF"
        return (
            f", ACTIVATION (STATUS = {status}, PROCEDURE_NAME = {proc},"
            f" MAX_QUEUE_READERS = {int(t.max_readers)}, EXECUTE AS {who})"
        )

    def _poison(self) -> str:
        return f"POISON_MESSAGE_HANDLING (STATUS = {'ON' if self.t.poison_message_handling else 'OFF'})"

    def create_queue(self) -> list[str]:
        return [
            f"IF OBJECT_ID({self._object(self.queue)}, N'SQ') IS NULL\n"
            f"CREATE QUEUE {self.queue} WITH STATUS = ON, RETENTION = OFF{self._activation()}, {self._poison()}"
        ]

    def create_sender_queue(self) -> list[str]:
        # Only end-of-conversation replies arrive here; cleanup receives them.
        return [
            f"IF OBJECT_ID({self._object(self.sender_queue)}, N'SQ') IS NULL\n"
            f"CREATE QUEUE {self.sender_queue} WITH STATUS = ON, RETENTION = OFF,"
            " POISON_MESSAGE_HANDLING (STATUS = OFF)"
        ]

    def alter_queue(self) -> list[str]:
        if self.t.activation_procedure is None:
            return [
                f"IF EXISTS (SELECT 1 FROM sys.service_queues WHERE object_id = OBJECT_ID({self._object(self.queue)})"
                f" AND activation_procedure IS NOT NULL)\n  ALTER QUEUE {self.queue} WITH ACTIVATION (DROP)",
                f"ALTER QUEUE {self.queue} WITH {self._poison()}",
            ]
        return [f"ALTER QUEUE {self.queue} WITH {self._activation()[2:]}, {self._poison()}"]

    def create_services(self) -> list[str]:
        svc, contract = self._lit(self.t.service), self._lit(self.t.contract)
        return [
            f"""IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = {svc})
  CREATE SERVICE {self.service} ON QUEUE {self.queue} ({self.contract})
ELSE IF NOT EXISTS (SELECT 1 FROM sys.service_contract_usages cu
  JOIN sys.services s ON s.service_id = cu.service_id
  JOIN sys.service_contracts c ON c.service_contract_id = cu.service_contract_id
  WHERE s.name = {svc} AND c.name = {contract})
  ALTER SERVICE {self.service} (ADD CONTRACT {self.contract})""",
            f"IF NOT EXISTS (SELECT 1 FROM sys.services WHERE name = {self._lit(self.t.sender_service)})\n"
            f"  CREATE SERVICE {self.sender_service} ON QUEUE {self.sender_queue}",
        ]

    def record_version(self) -> list[str]:
        return [
            f"""MERGE {self.shared.meta} WITH (HOLDLOCK) AS m
USING (SELECT {ms_literal(self.t.names.queue)} AS queue) AS s ON m.queue = s.queue
WHEN MATCHED THEN UPDATE SET schema_version = {BROKER_SCHEMA_VERSION}, updated_at = SYSUTCDATETIME()
WHEN NOT MATCHED THEN INSERT (queue, design, schema_version, ring_size, message_bytes)
  VALUES (s.queue, N'servicebroker', {BROKER_SCHEMA_VERSION}, 0, 0);"""
        ]

    # --- cleanup (parameters: stalled seconds, batch size) ------------------------------------
    def cleanup(self) -> str:
        """Ends, in one bounded batch: end-of-conversation replies waiting in the sender's queue;
        stalled conversations of the sender (begun by a sender that is gone: ended normally, so the
        queue still delivers their messages); and the queue's side of conversations with no
        message left that are past twice `stalled` seconds or already ended by the sender (a plain
        END CONVERSATION, which tells the other side); WITH CLEANUP only on the error path:
        conversations in the ERROR state, and the queue's side ended here whose sender never
        answered for twice `stalled` seconds. Parameters: stalled seconds, batch size. Answers
        one row: replies ended, sender conversations ended, queue conversations ended."""
        endpoints = "SELECT TOP (@batch) ce.conversation_handle FROM sys.conversation_endpoints ce JOIN sys.services s ON s.service_id = ce.service_id"
        age = f"DATEADD(second, -{DIALOG_LIFETIME_S}, ce.lifetime)"
        senders = (
            f"{endpoints}\n  WHERE s.name = {self._lit(self.t.sender_service)} AND ce.state IN ('SO', 'CO')"
            f" AND {age} < DATEADD(second, -@stalled, GETUTCDATE())"
        )
        # The queue's side once no message of it is left: ended by the sender (DI), or idle for
        # twice `stalled` (CO, SI). Plain END CONVERSATION: the sender is told.
        idle = f"{age} < DATEADD(second, -2 * @stalled, GETUTCDATE())"
        leftovers = (
            f"{endpoints}\n  WHERE s.name = {self._lit(self.t.service)} AND (ce.state = 'DI' OR (ce.state IN ('CO', 'SI') AND {idle}))"
            f"\n    AND NOT EXISTS (SELECT 1 FROM {self.queue} WITH (NOLOCK) WHERE conversation_handle = ce.conversation_handle)"
        )
        # The error path: either side in ERROR, and the queue's side ended here (DO) whose sender
        # never answered for twice `stalled`: no handshake can close them.
        failed = (
            f"{endpoints}\n  WHERE (s.name IN ({self.services_list}) AND ce.state = 'ER')"
            f"\n  OR (s.name = {self._lit(self.t.service)} AND ce.state = 'DO' AND {idle})"
        )
        return f"""SET NOCOUNT ON;
DECLARE @stalled int = ?, @batch int = ?, @h uniqueidentifier, @replies int = 0, @senders int = 0, @cleaned int = 0;
DECLARE @got TABLE (h uniqueidentifier, kind nvarchar(256));
DECLARE @taken int = 1, @received int = 0;
-- One RECEIVE answers one conversation group: receive again until the batch or the queue ends.
WHILE @taken > 0 AND @received < @batch
BEGIN
  RECEIVE TOP (@batch) conversation_handle, message_type_name FROM {self.sender_queue} INTO @got;
  SET @taken = @@ROWCOUNT;
  SET @received += @taken;
END;
{each_conversation("ends", "SELECT DISTINCT h FROM @got", "END CONVERSATION @h; SET @replies += 1;")}
{each_conversation("stalled", senders, "END CONVERSATION @h; SET @senders += 1;")}
{each_conversation("leftover", leftovers, "END CONVERSATION @h; SET @cleaned += 1;")}
-- dbq: error path: errored conversations, and ends the other side never answered
{each_conversation("failed", failed, "END CONVERSATION @h WITH CLEANUP; SET @cleaned += 1;")}
SELECT @replies, @senders, @cleaned;"""

    # --- maintenance ----------------------------------------------------------------------------
    def queue_figures(self) -> str:
        """The internal table's clustered index: name, pages, rows, ghost rows, fragmentation %
        (SAMPLED: LIMITED reports no ghost records)."""
        return f"""SELECT it.name, ISNULL(SUM(ps.page_count), 0), ISNULL(SUM(ps.record_count), 0),
  ISNULL(SUM(ps.ghost_record_count), 0), ISNULL(MAX(ps.avg_fragmentation_in_percent), 0)
FROM sys.internal_tables it
CROSS APPLY sys.dm_db_index_physical_stats(DB_ID(), it.object_id, 1, NULL, 'SAMPLED') ps
WHERE it.parent_object_id = OBJECT_ID({self._object(self.queue)}) AND ps.index_level = 0
GROUP BY it.name"""

    def maintenance_action(self, action: str) -> str:
        if action == "rebuild":
            return f"ALTER QUEUE {self.queue} REBUILD WITH (MAXDOP = 1)"
        if action == "reorganize":
            return f"ALTER QUEUE {self.queue} REORGANIZE WITH (LOB_COMPACTION = ON)"
        raise ValueError(f"a Service Broker queue has no maintenance action {action!r}")

    # --- teardown, in dependency order ----------------------------------------------------------
    def end_all_conversations(self) -> str:
        """Force: every conversation of the queue's services ended WITH CLEANUP (their messages go)."""
        every = (
            "SELECT ce.conversation_handle FROM sys.conversation_endpoints ce JOIN sys.services s"
            f" ON s.service_id = ce.service_id WHERE s.name IN ({self.services_list}) AND ce.state <> 'CD'"
        )
        return f"""SET NOCOUNT ON;
-- dbq: error path: a forced teardown drops the queue, so no conversation can end normally
DECLARE @h uniqueidentifier, @ended int = 0;
{each_conversation("every", every, "END CONVERSATION @h WITH CLEANUP; SET @ended += 1;")}
SELECT @ended;"""

    def drop(self) -> list[str]:
        t, q = self.t, self.t.names.queue
        out = [
            f"IF EXISTS (SELECT 1 FROM sys.services WHERE name = {self._lit(name)}) DROP SERVICE {ms_broker_quote(name)}"
            for name in (t.service, t.sender_service)
        ]
        out += [
            f"IF OBJECT_ID({self._object(queue)}, N'SQ') IS NOT NULL DROP QUEUE {queue}"
            for queue in (self.queue, self.sender_queue)
        ]
        out.append(
            f"IF EXISTS (SELECT 1 FROM sys.service_contracts WHERE name = {self._lit(t.contract)})"
            f" DROP CONTRACT {self.contract}"
        )
        out += [
            f"IF EXISTS (SELECT 1 FROM sys.service_message_types WHERE name = {self._lit(name)})"
            f" DROP MESSAGE TYPE {ms_broker_quote(name)}"
            for name in t.message_types
        ]
        out += [f"DROP SEQUENCE IF EXISTS {seq}" for seq in self.count.values()]
        out.append(
            f"IF OBJECT_ID({self._object(self.shared.meta)}, N'U') IS NOT NULL"
            f" DELETE FROM {self.shared.meta} WHERE queue = {ms_literal(q)}"
        )
        out.append(
            f"IF OBJECT_ID({self._object(self.shared.history)}, N'U') IS NOT NULL"
            f" DELETE FROM {self.shared.history} WHERE queue = {ms_literal(q)}"
        )
        return out
