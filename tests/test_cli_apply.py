"""`dbq apply`: the operator's reconcile straight against the database, with no cluster."""

from __future__ import annotations

import secrets

import yaml
from click.testing import CliRunner

from dbq.cli import main
from dbq.connection import from_url
from tests.manifests import queue


def write(tmp_path, name, docs):
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_apply_dry_run_delete_round_trip(postgres, tmp_path):
    schema = f"cli_{secrets.token_hex(4)}"
    doc = queue("cli-q")
    doc["spec"]["connection"]["schema"] = schema
    manifest = write(tmp_path, "q.yaml", [doc])
    secret = write(tmp_path, "s.yaml", [{"apiVersion": "v1", "kind": "Secret",
                                          "metadata": {"name": "orders-db", "namespace": "default"},
                                          "stringData": {"url": postgres.url}}])  # fmt: skip
    runner = CliRunner()
    plan = runner.invoke(main, ["apply", "-f", manifest, "--secret-file", secret, "--dry-run"])
    assert plan.exit_code == 0 and "create_ring" in plan.output, plan.output
    cur = postgres.connect().cursor()
    assert not cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval()

    done = runner.invoke(main, ["apply", "-f", manifest, "--secret-file", secret])
    assert done.exit_code == 0 and "Ready" in done.output, done.output
    assert cur.execute(f'SELECT count(*) FROM "{schema}".cli_q_ring').fetchval() == 64
    again = runner.invoke(main, ["apply", "-f", manifest, "--url", postgres.url, "--dry-run"])
    assert "in sync" in again.output

    cur.execute(f'SELECT * FROM "{schema}".cli_q_push(?, 0)', b"pending").fetchone()
    refused = runner.invoke(main, ["apply", "-f", manifest, "--url", postgres.url, "--delete"])
    assert refused.exit_code == 1 and "1 ready" in refused.output
    assert cur.execute(f'SELECT count(*) FROM "{schema}".cli_q_ring WHERE state = 1').fetchval() == 1
    dropped = runner.invoke(main, ["apply", "-f", manifest, "--url", postgres.url, "--delete", "--force"])
    assert dropped.exit_code == 0 and "dropped" in dropped.output
    assert not cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval()


def test_apply_reports_bad_input_without_touching_the_database(postgres, tmp_path):
    schema = f"cli_{secrets.token_hex(4)}"
    doc = queue("cli-bad")
    doc["spec"]["connection"]["schema"] = schema
    doc["spec"]["ring"]["size"] = 0
    result = CliRunner().invoke(
        main, ["apply", "-f", write(tmp_path, "q.yaml", [doc]), "--url", postgres.url]
    )
    assert result.exit_code == 1 and "InvalidSpec" in result.output and "spec.ring.size" in result.output
    wrong = postgres.url.replace(f":{from_url(postgres.url).password}@", ":x@", 1)
    doc["spec"]["ring"]["size"] = 64
    result = CliRunner().invoke(main, ["apply", "-f", write(tmp_path, "q2.yaml", [doc]), "--url", wrong])
    assert result.exit_code == 1 and "AuthenticationFailed" in result.output
    assert wrong.split("@")[0].split(":")[-1] not in result.output
    cur = postgres.connect().cursor()
    assert not cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval()


def test_apply_provisions_the_queue_keeping_dead_letters_first_and_deletes_it_last(postgres, tmp_path):
    schema = f"cli_{secrets.token_hex(4)}"
    user = queue("cli-user", deadLetter={"maxAttempts": 2, "queue": "cli-errors"}, deletionPolicy="Delete")
    keeper = queue("cli-errors", deletionPolicy="Delete")
    for doc in (user, keeper):
        doc["spec"]["connection"]["schema"] = schema
    manifest = write(tmp_path, "q.yaml", [user, keeper])  # the user first, as a person might write it
    runner = CliRunner()
    done = runner.invoke(main, ["apply", "-f", manifest, "--url", postgres.url])
    assert done.exit_code == 0 and done.output.count("Ready") == 2, done.output
    cur = postgres.connect().cursor()
    recorded = cur.execute(f"SELECT dead_letter_queue FROM \"{schema}\".dbq_queues WHERE queue = 'cli_user'")
    assert recorded.fetchval() == f"{schema}.cli_errors"
    alone = runner.invoke(main, ["apply", "-f", write(tmp_path, "u.yaml", [user]), "--url", postgres.url])
    assert (
        alone.exit_code == 1
        and "DeadLetterQueueNotFound" in alone.output
        and "default/cli-errors" in alone.output
    )
    dropped = runner.invoke(main, ["apply", "-f", manifest, "--url", postgres.url, "--delete"])
    assert dropped.exit_code == 0 and dropped.output.index("cli-user") < dropped.output.index("cli-errors")
    assert not cur.execute("SELECT count(*) FROM pg_namespace WHERE nspname = ?", schema).fetchval()


def test_apply_resizes_a_ring_online_only_when_told_the_objects_are_its_own(postgres, tmp_path):
    schema = f"cli_{secrets.token_hex(4)}"
    doc = queue("cli-size", deletionPolicy="Delete")
    doc["spec"]["connection"]["schema"] = schema
    runner = CliRunner()

    def apply(size: int, *more: str) -> tuple[int, str]:
        doc["spec"]["ring"]["size"] = size
        args = ["apply", "-f", write(tmp_path, "q.yaml", [doc]), "--url", postgres.url, *more]
        done = runner.invoke(main, args)
        return done.exit_code, " ".join(done.output.split())  # one line, however the console wrapped it

    assert apply(64)[0] == 0
    cur = postgres.connect().cursor()
    cur.execute(f'SELECT * FROM "{schema}".cli_size_push(?, 0)', b"first").fetchone()
    code, said = apply(128)  # perhaps another Queue's objects: not resized without --resize
    assert code == 1 and "ConflictingObjects" in said, said
    code, said = apply(128, "--resize")
    assert code == 0 and "from 64 to 128 slots" in said and "still draining (1 message(s) to pop" in said, (
        said
    )
    assert cur.execute(f'SELECT * FROM "{schema}".cli_size_pop(0)').fetchone() is not None
    code, said = apply(128, "--resize")
    assert code == 0 and "1 older ring(s) retired" in said and "draining" not in said, said
    assert cur.execute(f'SELECT count(*) FROM "{schema}".cli_size_ring').fetchval() == 128
    assert apply(128, "--delete")[0] == 0
