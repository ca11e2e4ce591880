-- One Queue's backlog, as KEDA's postgresql scaler reads it for a QueueConsumer (spec.measure):
-- a call of the queue's stats routine, which reads its totals, not its rows, and which the
-- monitor right may call. The operator joins one term per Queue into one SELECT: with `+` for
-- the depths, with GREATEST for the oldest age. {stats} is the routine, validated and quoted.
-- if depth
(SELECT o_depth FROM {stats}())
-- end if
-- if depth_and_in_flight
(SELECT o_depth + o_in_flight FROM {stats}())
-- end if
-- if oldest_age
(SELECT coalesce(ceil(o_oldest_age_s), 0)::bigint FROM {stats}())
-- end if
