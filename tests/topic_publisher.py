"""A publisher process for the topic crash tests (PostgreSQL and Cassandra): publishes bodies `<prefix>-<n>` to a topic
until killed, singly or `--batch` at a time, writing `P <body>` to its log after each publish
returns (so a body published and not yet logged is possible, never the reverse)."""

from __future__ import annotations

import argparse
import sys

from dbq.client import connect_topic


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("schema")
    p.add_argument("topic")
    p.add_argument("log")
    p.add_argument("--prefix", default="m")
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    topic = connect_topic(a.url, a.topic, schema=a.schema)
    n = 0
    with open(a.log, "a", buffering=1) as log:
        while True:
            bodies = [f"{a.prefix}-{n + i}".encode() for i in range(a.batch)]
            if a.batch == 1:
                topic.publish(bodies[0], headers={"n": n})
            else:
                topic.publish_many(bodies, headers=[{"n": n + i} for i in range(a.batch)])
            log.write("".join(f"P {b.decode()}\n" for b in bodies))
            n += a.batch


if __name__ == "__main__":
    sys.exit(main())
