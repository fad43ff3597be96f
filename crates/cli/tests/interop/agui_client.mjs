// AG-UI's official client (npm `@ag-ui/client`) against `toolgraph serve`'s `/ag-ui/{agent}`.
//
// Usage: node agui_client.mjs BASE_URL API_KEY CLIENT_ENTRY. Prints, as one JSON object, what
// the client saw: a run with a tool call, a run that stops on a write waiting for approval (an
// interrupt), the run that resumes it, the same resume sent again, and the messages the client
// holds after. The Rust test (tests/agui.rs) asserts on it.
import { pathToFileURL } from "node:url";

const [base, key, entry] = process.argv.slice(2);
const { HttpAgent } = await import(pathToFileURL(entry).href);
const headers = { Authorization: `Bearer ${key}`, "X-Tenant-Slug": "demo", "X-User-Id": "1" };
const agent = new HttpAgent({ url: `${base}/ag-ui/assistant`, headers, threadId: "a-thread-of-the-client" });

async function run(params) {
  const types = [];
  let finished = null;
  const result = await agent.runAgent(params, {
    onEvent({ event }) {
      types.push(event.type);
    },
    onRunFinishedEvent(p) {
      finished = { outcome: p.outcome, interrupts: p.interrupts ?? null, threadId: p.event.threadId };
    },
  });
  return { types, finished, result: result.result ?? null, state: agent.state ?? null };
}

const out = {};
agent.addMessage({ id: "u1", role: "user", content: "¿Cuánto es 6 por 7?" });
out.first = await run({});
agent.addMessage({ id: "u2", role: "user", content: "Guarda una nota sobre Docker" });
out.pending = await run({});
const interrupt = out.pending.finished?.interrupts?.[0];
const approve = [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }];
out.resumed = await run({ resume: approve });
// The same resume again (a client retrying): the reply the run gave, nothing run twice.
out.resumed_again = await run({ resume: approve });
out.messages = agent.messages.map((m) => ({
  role: m.role,
  content: typeof m.content === "string" ? m.content : null,
  toolCalls: (m.toolCalls ?? []).map((c) => c.function.name),
}));
try {
  const stranger = new HttpAgent({ url: `${base}/ag-ui/nope`, headers });
  stranger.addMessage({ id: "x", role: "user", content: "hola" });
  await stranger.runAgent({});
  out.unknown_agent = "ran";
} catch (e) {
  out.unknown_agent = String(e?.message ?? e);
}
console.log(JSON.stringify(out));
