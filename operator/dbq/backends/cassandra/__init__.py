"""Cassandra "pipes" queues: CQL in `cql`, planning in `plan`, sessions in `session`."""
