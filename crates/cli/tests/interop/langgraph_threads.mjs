// LangGraph's JS SDK (npm `@langchain/langgraph-sdk`) against `toolgraph serve`'s threads and
// runs.
//
// Usage: node langgraph_threads.mjs BASE_URL API_KEY SDK_ENTRY. Prints, as one JSON object, what
// the client saw: a thread made, a calculator turn streamed in `values`, `updates` and
// `messages-tuple`, a write paused and resumed (approved) by `command.resume`, three more
// decided as LangChain's human-in-the-loop decisions (an edit, a rejection with a message, a
// response), a rollback, a state update and a fork from the checkpoint before it, and the thread
// deleted. The Rust test (tests/langgraph.rs) asserts on it.
import { pathToFileURL } from "node:url";

const [base, key, entry] = process.argv.slice(2);
const { Client } = await import(pathToFileURL(entry).href);
const client = new Client({
  apiUrl: base,
  apiKey: null,
  defaultHeaders: { Authorization: `Bearer ${key}`, "X-Tenant-Slug": "demo", "X-User-Id": "1" },
});

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push({ event: part.event, data: part.data });
  return parts;
}

const out = {};
const thread = await client.threads.create({ metadata: { course: "iv" } });
const tid = thread.thread_id;
out.created = thread;
out.first_run = await collect(
  client.runs.stream(tid, "assistant", {
    input: { messages: [{ type: "human", content: "¿Cuánto es 6 por 7?" }] },
    streamMode: ["values", "updates", "messages-tuple"],
  }),
);
out.paused = await client.runs.wait(tid, "assistant", {
  input: { messages: [{ type: "human", content: "Guarda una nota: examen el viernes" }] },
});
out.state = await client.threads.getState(tid);
out.resumed = await collect(
  client.runs.stream(tid, "assistant", {
    command: { resume: { decisions: [{ type: "approve" }] } },
    streamMode: ["values", "messages-tuple"],
  }),
);
out.after = await client.threads.get(tid);
// Each of the other decisions on a write of its own.
const decided = async (said, decision) => {
  await client.runs.wait(tid, "assistant", { input: { messages: [{ type: "human", content: said }] } });
  return client.runs.wait(tid, "assistant", { command: { resume: { decisions: [decision] } } });
};
out.edited = await decided("Y otra: repaso el jueves", {
  type: "edit",
  edited_action: { name: "note_write", args: { title: "Repaso", body: "El miércoles." } },
});
out.rejected = await decided("Y la tutoría el lunes", { type: "reject", message: "No, el martes." });
out.responded = await decided("Y el examen final", { type: "respond", message: "Ya lo tengo." });
// A slow run rolled back by the next (`multitaskStrategy: "rollback"`): what it wrote goes.
const doomed = await client.runs.create(tid, "assistant", {
  input: { messages: [{ type: "human", content: "cuéntame algo largo" }] },
});
for (let i = 0; i < 200 && (await client.threads.get(tid)).status !== "busy"; i++) {
  await new Promise((r) => setTimeout(r, 50));
}
out.rolled_back = await client.runs.wait(tid, "assistant", {
  input: { messages: [{ type: "human", content: "¿sigues?" }] },
  multitaskStrategy: "rollback",
});
try {
  await client.runs.get(tid, doomed.run_id);
  out.doomed_run = null;
} catch (e) {
  out.doomed_run = { status: e.status ?? null };
}
// A message written into the state as the `agent` node, then a run from the checkpoint before it
// (a fork of the thread there, without the update).
const [before] = await client.threads.getHistory(tid, { limit: 1 });
out.updated = await client.threads.updateState(tid, {
  values: { messages: [{ type: "ai", content: "Nota al margen." }] },
  asNode: "agent",
});
out.updated_state = await client.threads.getState(tid);
out.forked = await client.runs.wait(tid, "assistant", {
  input: { messages: [{ type: "human", content: "¿Y ahora?" }] },
  checkpointId: before.checkpoint.checkpoint_id,
});
await client.threads.delete(tid);
try {
  await client.threads.get(tid);
  out.deleted = null;
} catch (e) {
  out.deleted = { status: e.status ?? null, message: String(e.message ?? e) };
}
console.log(JSON.stringify(out));
