//! One scenario of PGMQ's Rust client (crates.io `pgmq`, PGMQueueExt) against a PGMQ API: the
//! real PGMQ or dbq's. Prints each call's answer as JSON, times as whole seconds from the call,
//! errors as their SQLSTATE class, so two runs compare line for line (tests/test_pgmq_facade.py).
//!   pgmq-scenario URL QUEUE CREATE_EXTENSION(yes|no)
use pgmq::{Message, PGMQueueExt, PgmqError};
use serde_json::{json, Value};

fn seen(m: &Message) -> Value {
    let vt_s = (m.vt - chrono::Utc::now()).num_milliseconds() as f64 / 1000.0;
    json!([m.msg_id, m.read_ct, m.message, vt_s.round() as i64])
}

// by id: PGMQ answers in the order its UPDATE met the rows, which is not the id's
fn seen_all(ms: &[Message]) -> Value {
    let mut ms: Vec<&Message> = ms.iter().collect();
    ms.sort_by_key(|m| m.msg_id);
    Value::Array(ms.into_iter().map(seen).collect())
}

fn answer(result: Result<Value, PgmqError>) -> Value {
    match result {
        Ok(v) => v,
        Err(PgmqError::DatabaseError(sqlx::Error::Database(e))) => {
            json!(format!("error {}", &e.code().unwrap_or_default()[..2]))
        }
        Err(PgmqError::InvalidQueueName { .. }) => json!("error client: invalid queue name"),
        Err(e) => json!(format!("error other: {e}")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), PgmqError> {
    let args: Vec<String> = std::env::args().collect();
    let (url, q, create_extension) = (&args[1], args[2].as_str(), args[3] == "yes");
    let pgmq = PGMQueueExt::new(url.clone(), 2).await?;
    let mut answers: Vec<Value> = Vec::new();
    let mut call = |name: &str, result: Result<Value, PgmqError>| {
        answers.push(json!([name, answer(result)]));
    };
    if create_extension {
        call("init", pgmq.init().await.map(|b| json!(b)));
    } else {
        call("init", Ok(json!(true))); // PGMQ installed SQL-only: nothing to create
    }
    call("create", pgmq.create(q).await.map(|b| json!(b)));
    call("send", pgmq.send(q, &json!({"n": 1})).await.map(|id| json!(id)));
    let batch = [json!({"n": 2}), json!([3]), json!("four"), json!(5)];
    call("send_batch", pgmq.send_batch(q, &batch).await.map(|ids| json!(ids)));
    call("send_delay", pgmq.send_delay(q, &json!({"n": 6}), 30).await.map(|id| json!(id)));
    let headers = json!({"trace": "t-1"});
    call(
        "send_delay_with_headers",
        pgmq.send_delay_with_headers(q, &json!({"n": 7}), Some(&headers), 30).await.map(|id| json!(id)),
    );
    call("read", pgmq.read::<Value>(q, 30).await.map(|m| m.as_ref().map_or(Value::Null, seen)));
    call(
        "read_batch vt 0",
        pgmq.read_batch::<Value>(q, 0, 2).await.map(|ms| seen_all(&ms)),
    );
    call(
        "read_batch again",
        pgmq.read_batch::<Value>(q, 30, 10).await.map(|ms| seen_all(&ms)),
    );
    call("set_vt", pgmq.set_vt::<Value>(q, 2, 0).await.map(|m| seen(&m)));
    call("pop", pgmq.pop::<Value>(q).await.map(|m| m.as_ref().map_or(Value::Null, seen)));
    call(
        "read_batch_with_poll empty",
        pgmq.read_batch_with_poll::<Value>(q, 30, 5, Some(std::time::Duration::from_secs(1)), None)
            .await
            .map(|ms| ms.as_deref().map_or(Value::Null, seen_all)),
    );
    call("delete", pgmq.delete(q, 3).await.map(|b| json!(b)));
    call("delete again", pgmq.delete(q, 3).await.map(|b| json!(b)));
    call("delete_batch", pgmq.delete_batch(q, &[4, 999]).await.map(|n| json!(n)));
    call("archive", pgmq.archive(q, 5).await.map(|b| json!(b)));
    call("archive_batch", pgmq.archive_batch(q, &[1, 998]).await.map(|n| json!(n)));
    call(
        "metrics",
        pgmq.metrics(q).await.map(|m| json!([m.queue_name, m.queue_length, m.total_messages, m.queue_visible_length])),
    );
    call(
        "metrics_all",
        pgmq.metrics_all().await.map(|ms| json!(ms.iter().filter(|m| m.queue_name == q).count())),
    );
    call(
        "list_queues",
        pgmq.list_queues().await.map(|qs| {
            json!(qs.unwrap_or_default().iter().filter(|m| m.queue_name == q).map(|m| m.queue_name.clone()).collect::<Vec<_>>())
        }),
    );
    call("purge_queue", pgmq.purge_queue(q).await.map(|n| json!(n)));
    call("metrics after purge", pgmq.metrics(q).await.map(|m| json!(m.queue_length)));
    call("send to a bad name", pgmq.send("bad;name", &json!({"n": 1})).await.map(|id| json!(id)));
    let missing = format!("{q}_not_there");
    call(
        "read a queue not there",
        pgmq.read_batch::<Value>(&missing, 30, 1).await.map(|ms| seen_all(&ms)),
    );
    println!("{}", Value::Array(answers));
    Ok(())
}
