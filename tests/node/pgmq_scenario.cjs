// One scenario of PGMQ's Node client (pgmq-js, from npm) against a PGMQ API: the real PGMQ or
// dbq's. Prints each call's answer as JSON, times as whole seconds from the call, errors as their
// SQLSTATE class, so two runs compare line for line (tests/test_pgmq_facade.py).
//   node pgmq_scenario.cjs URL QUEUE CREATE_EXTENSION(yes|no)
const { Pgmq } = require("pgmq-js");

const seen = (m) => m && [m.msgId, m.readCount, m.message, Math.round((m.vt - Date.now()) / 1000)];
// by id: PGMQ answers in the order its UPDATE met the rows, which is not the id's
const seenAll = (ms) => ms.map(seen).sort((a, b) => a[0] - b[0]);

(async () => {
  const [url, q, createExtension] = process.argv.slice(2);
  const u = new URL(url);
  const pgmq = await Pgmq.new(
    { host: u.hostname, port: Number(u.port), database: u.pathname.slice(1),
      user: decodeURIComponent(u.username), password: decodeURIComponent(u.password), ssl: false },
    { skipExtensionCreation: createExtension !== "yes" },
  );
  const answers = [];
  const call = async (name, f) => {
    try {
      answers.push([name, await f()]);
    } catch (e) {
      answers.push([name, `error ${String(e.code || "").slice(0, 2)}`]);
    }
  };
  await call("create", () => pgmq.queue.create(q));
  await call("send", () => pgmq.msg.send(q, { n: 1 }));
  await call("sendBatch", () => pgmq.msg.sendBatch(q, [{ n: 2 }, [3], "four", 5]));
  await call("send delayed", () => pgmq.msg.send(q, { n: 6 }, 30));
  await call("read", async () => seen(await pgmq.msg.read(q, 30)));
  await call("read vt 0", async () => seenAll(await pgmq.msg.readBatch(q, 0, 2)));
  await call("read again", async () => seenAll(await pgmq.msg.readBatch(q, 30, 10)));
  await call("setVt", async () => seen(await pgmq.msg.setVt(q, 2, 0)));
  await call("pop", async () => seen(await pgmq.msg.pop(q)));
  await call("delete", () => pgmq.msg.delete(q, 3));
  await call("delete again", () => pgmq.msg.delete(q, 3));
  await call("deleteBatch", () => pgmq.msg.deleteBatch(q, [4, 999]));
  await call("archive", () => pgmq.msg.archive(q, 5));
  await call("archiveBatch", () => pgmq.msg.archiveBatch(q, [1, 998]));
  await call("metrics", async () => {
    const m = await pgmq.queue.getMetrics(q);
    return [m.queueName, m.queueLength, m.totalMessages];
  });
  await call("metrics all", async () => (await pgmq.queue.getAllMetrics()).filter((m) => m.queueName === q).length);
  await call("list", async () => (await pgmq.queue.list()).filter((x) => x.name === q).map((x) => x.name));
  await call("purge", () => pgmq.queue.purge(q));
  await call("metrics after purge", async () => (await pgmq.queue.getMetrics(q)).queueLength);
  await call("send to a bad name", () => pgmq.msg.send("bad;name", { n: 1 }));
  await call("read a queue not there", () => pgmq.msg.readBatch(q + "_not_there", 30, 1));
  console.log(JSON.stringify(answers));
  await pgmq.close();
})();
