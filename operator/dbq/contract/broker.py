"""The Service Broker queue's data-plane contract: its object names and the statements the client
(`dbq.client.broker`) and the operator (`dbq.backends.sqlserver`) both run, the schema version.

Names are validated and bracket-quoted (`ms_quote`, `ms_broker_quote`) or written as validated
literals; numbers are validated integers; values are bound parameters (`?`).
"""

from __future__ import annotations

from dbq.names import QueueNames, ms_broker_literal, ms_broker_quote, ms_quote

# The last value a sequence gave out, as a bigint (0 before the first), read from a row of
# sys.sequences. `last_used_value` is documented for NEXT VALUE FOR only, while
# sys.sp_sequence_get_range (batches) moves `current_value`, which reads START WITH before the
# first value: so current_value, unless the sequence has given nothing out yet.
SEQUENCE_DRAWN = (
    "CASE WHEN last_used_value IS NULL AND current_value = start_value THEN CAST(start_value AS bigint) - 1"
    " ELSE CAST(current_value AS bigint) END"
)
# The longest a client reuses one conversation (`conversation_seconds`), and so the youngest a
# sender's conversation cleanup may end: twice that, whatever spec.timeouts.stalledAfter says.
CONVERSATION_SECONDS_MAX = 300.0


def stalled_after(stalled_after_s: float) -> int:
    """The age past which cleanup ends a sender's conversation: never one a client still uses."""
    return int(max(stalled_after_s, 2 * CONVERSATION_SECONDS_MAX))


# Version of the objects dbq creates for a Service Broker queue (2: the rights' roles and grants).
BROKER_SCHEMA_VERSION = 2
# The totals a Service Broker queue keeps in sequences (its catalog keeps none).
BROKER_COUNTERS = ("pushed", "popped", "acquired", "settled")
# Conversations dbq begins live this long (the largest LIFETIME, also SQL Server's default), so
# an endpoint's age is its `lifetime` minus this: cleanup finds stalled ones by age.
DIALOG_LIFETIME_S = 2_147_483_647
END_DIALOG = "http://schemas.microsoft.com/SQL/ServiceBroker/EndDialog"
ERROR = "http://schemas.microsoft.com/SQL/ServiceBroker/Error"


def each_conversation(name: str, select: str, then: str) -> str:
    """A T-SQL loop running `then` (which reads @h) for each conversation handle `select` answers."""
    return f"""DECLARE {name} CURSOR LOCAL FAST_FORWARD FOR
  {select};
OPEN {name}; FETCH NEXT FROM {name} INTO @h;
WHILE @@FETCH_STATUS = 0
BEGIN
  {then} FETCH NEXT FROM {name} INTO @h;
END;
CLOSE {name}; DEALLOCATE {name};"""


class BrokerStatements:
    def __init__(self, names: QueueNames) -> None:
        self.names = names
        self.schema = ms_quote(names.schema)
        self.queue = f"{self.schema}.{ms_quote(names.queue)}"
        self.sender_queue = f"{self.schema}.{ms_quote(names.sender_queue)}"
        self.message_type_name, self.tracer_type_name = names.broker("message"), names.broker("tracer")
        self.message_type = ms_broker_quote(self.message_type_name)
        self.tracer_type = ms_broker_quote(self.tracer_type_name)
        self.contract = ms_broker_quote(names.broker("contract"))
        self.service = ms_broker_quote(names.broker())
        self.sender_service = ms_broker_quote(names.broker("sender"))
        self.count = {c: f"{self.schema}.{ms_quote(names.counter(c))}" for c in BROKER_COUNTERS}
        self.services_list = (
            f"{ms_broker_literal(names.broker())}, {ms_broker_literal(names.broker('sender'))}"
        )

    def _lit(self, name: str) -> str:
        return ms_broker_literal(name)

    def _object(self, qualified: str) -> str:
        """OBJECT_ID's argument for a bracket-quoted, validated name."""
        return f"N'{qualified}'"

    def provisioned(self) -> str:
        """1 when the queue's service exists, else 0."""
        return f"SELECT COUNT(*) FROM sys.services WHERE name = {self._lit(self.names.broker())}"

    def commit_open(self) -> str:
        """Commit a receive's transaction that returned no message (it may have ended conversations)."""
        return "IF @@TRANCOUNT > 0 COMMIT TRANSACTION"

    def begin_dialog(self) -> str:
        """A new conversation from the sender's service: its handle and conversation id."""
        return f"""SET NOCOUNT ON;
DECLARE @h uniqueidentifier;
BEGIN DIALOG CONVERSATION @h FROM SERVICE {self.sender_service} TO SERVICE {self._lit(self.names.broker())}
  ON CONTRACT {self.contract} WITH ENCRYPTION = OFF, LIFETIME = {DIALOG_LIFETIME_S};
SELECT @h, conversation_id FROM sys.conversation_endpoints WHERE conversation_handle = @h;"""

    def end_dialog(self) -> str:
        """The sender ends its conversation (parameter: handle): its messages stay deliverable."""
        return "DECLARE @h uniqueidentifier = ?; END CONVERSATION @h;"

    def send(self, n: int, tracer: bool = False) -> str:
        """`n` messages on one conversation, in one transaction (parameters: handle, then bodies)."""
        kind = self.tracer_type if tracer else self.message_type
        sends = "\n".join(f"SEND ON CONVERSATION @h MESSAGE TYPE {kind} (?);" for _ in range(int(n)))
        count = "" if tracer else self._add("pushed", str(int(n)))
        return f"""SET NOCOUNT ON; SET XACT_ABORT ON;
DECLARE @h uniqueidentifier = ?;
BEGIN TRANSACTION;
{sends}
COMMIT TRANSACTION;{count}"""

    def _add(self, counter: str, amount: str) -> str:
        """Advance a total by `amount` (a validated integer or a variable) in one call."""
        return (
            f"\nDECLARE @first_{counter} sql_variant;"
            f"\nEXEC sys.sp_sequence_get_range @sequence_name = {self._object(self.count[counter])},"
            f" @range_size = {amount}, @range_first_value = @first_{counter} OUTPUT;"
        )

    def receive(self, hold: bool) -> str:
        """Wait up to a timeout for up to n messages of one conversation group (parameters: n,
        timeout ms). Ends the conversations whose sender ended them (or that failed) and answers
        the messages: conversation handle, sequence number, kind (message or tracer), body.
        `hold`: in a transaction left open, committed by ack and rolled back by nack (the caller
        ends it when no message came); else at-most-once, committed at once."""
        counter = "acquired" if hold else "popped"
        end = "" if hold else "\nCOMMIT TRANSACTION;"
        return f"""SET NOCOUNT ON;
DECLARE @n int = ?, @timeout int = ?, @h uniqueidentifier, @taken bigint;
DECLARE @got TABLE (h uniqueidentifier, seq bigint, kind nvarchar(256), body varbinary(max));
BEGIN TRANSACTION;
WAITFOR (RECEIVE TOP (@n) conversation_handle, message_sequence_number, message_type_name, message_body
  FROM {self.queue} INTO @got), TIMEOUT @timeout;
{each_conversation("ends", f"SELECT DISTINCT h FROM @got WHERE kind IN (N'{END_DIALOG}', N'{ERROR}')", "END CONVERSATION @h;")}
SET @taken = (SELECT COUNT_BIG(*) FROM @got WHERE kind = {self._lit(self.message_type_name)});
IF @taken > 0
BEGIN{self._add(counter, "@taken")}
END;{end}
SELECT h, seq, CASE kind WHEN {self._lit(self.tracer_type_name)} THEN N'tracer' ELSE N'message' END, body
FROM @got WHERE kind IN ({self._lit(self.message_type_name)}, {self._lit(self.tracer_type_name)}) ORDER BY seq;"""

    def settle(self, commit: bool) -> str:
        """Ack (commit) or nack (roll back) a held receive, counting the lease settled."""
        verb = "COMMIT" if commit else "ROLLBACK"
        return f"SET NOCOUNT ON; IF @@TRANCOUNT > 0 {verb} TRANSACTION;{self._add('settled', '1')}"

    def conversation_ids(self) -> str:
        """The conversation id of a handle (parameter): the same on both sides of a conversation."""
        return "SELECT conversation_id FROM sys.conversation_endpoints WHERE conversation_handle = ?"

    def stats(self) -> str:
        """depth, in flight, pushed, popped, acquired, expired (none: no message lifetime), oldest
        age s. Depth is the internal table's row count (O(1), and it includes end-of-conversation
        messages not yet received); the oldest age reads message_enqueue_time (SQL Server 2016+)."""
        total = {
            c: f"(SELECT {SEQUENCE_DRAWN} FROM sys.sequences"
            f" WHERE object_id = OBJECT_ID({self._object(seq)}))"
            for c, seq in self.count.items()
        }
        return f"""SET NOCOUNT ON;
DECLARE @age float = (SELECT ISNULL(DATEDIFF_BIG(millisecond, MIN(message_enqueue_time), SYSDATETIMEOFFSET()), 0)
  / 1000.0 FROM {self.queue} WITH (NOLOCK));
SELECT
  (SELECT ISNULL(SUM(p.rows), 0) FROM sys.internal_tables it JOIN sys.partitions p
    ON p.object_id = it.object_id AND p.index_id = 1 WHERE it.parent_object_id = OBJECT_ID({self._object(self.queue)})),
  {total["acquired"]} - {total["settled"]},
  {total["pushed"]}, {total["popped"]}, {total["acquired"]}, 0, @age;"""

    def trace(self) -> str:
        """A tracer token (parameter: timeout ms): a tracer message sent from the sender's service
        and received back from the queue by its conversation, both conversation ends closed.
        Answers: received (1/0), milliseconds from send to receive, the transmission status
        while it was not delivered."""
        return f"""SET NOCOUNT ON;
DECLARE @timeout int = ?, @h uniqueidentifier, @target uniqueidentifier, @sent datetime2(7), @ms bigint = NULL;
DECLARE @got TABLE (h uniqueidentifier);
BEGIN DIALOG CONVERSATION @h FROM SERVICE {self.sender_service} TO SERVICE {self._lit(self.names.broker())}
  ON CONTRACT {self.contract} WITH ENCRYPTION = OFF, LIFETIME = {DIALOG_LIFETIME_S};
SET @sent = SYSUTCDATETIME();
SEND ON CONVERSATION @h MESSAGE TYPE {self.tracer_type} (0x);
SELECT @target = t.conversation_handle FROM sys.conversation_endpoints i
  JOIN sys.conversation_endpoints t ON t.conversation_id = i.conversation_id AND t.is_initiator = 0
  WHERE i.conversation_handle = @h;
IF @target IS NOT NULL
  WAITFOR (RECEIVE TOP (1) conversation_handle FROM {self.queue} INTO @got WHERE conversation_handle = @target),
    TIMEOUT @timeout;
IF EXISTS (SELECT 1 FROM @got) SET @ms = DATEDIFF_BIG(microsecond, @sent, SYSUTCDATETIME()) / 1000;
DECLARE @status nvarchar(4000) = ISNULL((SELECT TOP (1) transmission_status FROM sys.transmission_queue
  WHERE conversation_handle = @h), N'');
-- Plain ends: the target's end reaches the sender's queue, where cleanup ends the sender's side.
IF @target IS NOT NULL END CONVERSATION @target;
ELSE END CONVERSATION @h;
SELECT CASE WHEN @ms IS NULL THEN 0 ELSE 1 END, ISNULL(@ms, 0), @status;"""
