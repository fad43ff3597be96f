// The playground: talks to this service's own HTTP API (same origin, no build step).
// POST streams are read with fetch() and an SSE parser: EventSource cannot POST or send headers.

// The event names of a run's frames: toolgraph-protocol's `Frame` (crates/protocol/src/frame.rs)
// defines them and their data; this page reads the six the service emits.
const FRAME = Object.freeze({
  TOKEN: "token",
  TOOL_CALL: "tool_call",
  TOOL_RESULT: "tool_result",
  PENDING: "pending",
  DONE: "done",
  ERROR: "error",
});

const $ = (id) => document.getElementById(id);
const config = JSON.parse($("playground-config").textContent || "{}");
let conversationId = null;
let busy = false;

function who() {
  return {
    tenantSlug: $("tenant-slug").value.trim(),
    tenantId: Number($("tenant-id").value),
    userId: Number($("user-id").value),
  };
}

/** `key=value, key=value` in the field `id` → an object; `null` when empty. */
function pairsOf(id) {
  const pairs = $(id).value.split(",").map((p) => p.trim()).filter(Boolean);
  if (!pairs.length) return null;
  const out = {};
  for (const p of pairs) {
    const at = p.indexOf("=");
    if (at > 0) out[p.slice(0, at).trim()] = p.slice(at + 1).trim();
  }
  return out;
}

const context = () => pairsOf("context");

function headers() {
  const h = { "Content-Type": "application/json", "X-Tenant-Slug": who().tenantSlug };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function showError(text) {
  const s = $("status");
  s.textContent = text;
  s.hidden = !text;
}

function item(className, text) {
  const li = document.createElement("li");
  li.className = className;
  if (text !== undefined) li.textContent = text;
  $("log").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function setConversation(id) {
  conversationId = id;
  $("conversation-label").textContent = id == null ? "A new conversation" : `Conversation ${id}`;
}

/** Why a response failed, from its `{error}` body when it has one; the actions it names as
 * waiting for a decision (a 409 `pendingActions`) are shown as cards. */
async function failure(response) {
  let detail = "";
  try {
    const body = await response.json();
    detail = body.error || JSON.stringify(body);
    for (const action of body.pendingActions || []) {
      if (!document.querySelector(`[data-message-id="${action.messageId}"]`)) pendingCard(action);
    }
  } catch (_) {
    detail = response.statusText;
  }
  const retry = response.headers.get("Retry-After");
  return `The service answered ${response.status}: ${detail}${retry ? ` (retry after ${retry} s)` : ""}`;
}

/** Reads SSE frames from a fetch response; calls onFrame({event, data, id}) per frame. */
async function readFrames(response, onFrame) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const frame = { event: "message", data: "", id: null };
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") frame.event = value;
        else if (field === "data") data.push(value);
        else if (field === "id") frame.id = value;
      }
      frame.data = data.join("\n");
      if (frame.data || frame.event !== "message") onFrame(frame);
    }
  }
}

/** One turn's rendering: the assistant's text, tool cards and pending actions. */
class Turn {
  constructor() {
    this.text = null;
    this.tools = new Map();
    this.lastId = null;
    this.finished = false;
    this.bubbles = [];
    this.sources = new Map();
  }

  /** Remembers the cited chunks a tool returned (`results[].metadata.citation`). */
  collectSources(outcome) {
    const results = outcome && Array.isArray(outcome.results) ? outcome.results : [];
    for (const r of results) {
      const m = r.metadata || {};
      if (m.citation && !this.sources.has(m.citation)) {
        this.sources.set(m.citation, { content: r.content || "", source: m.source || m.title || m.doc_id || "" });
      }
    }
  }

  frame({ event, data, id }) {
    if (id) this.lastId = id;
    let d = {};
    try { d = data ? JSON.parse(data) : {}; } catch (_) { d = { raw: data }; }
    switch (event) {
      case FRAME.TOKEN:
        if (!this.text) {
          this.text = item("msg assistant", "");
          this.bubbles.push(this.text);
        }
        this.text.textContent += d.content || "";
        break;
      case FRAME.TOOL_CALL: {
        const card = item("card tool");
        card.dataset.tool = d.name;
        card.innerHTML = `<div><span class="name"></span> <span class="muted">called</span></div><pre class="args"></pre><div class="outcome muted">running…</div>`;
        card.querySelector(".name").textContent = d.name;
        card.querySelector(".args").textContent = JSON.stringify(d.arguments, null, 1);
        card.dataset.args = JSON.stringify(d.arguments);
        card.started = performance.now();
        this.tools.set(d.callId || d.call_id || d.name, card);
        this.text = null;
        break;
      }
      case FRAME.TOOL_RESULT: {
        const card = this.tools.get(d.callId || d.call_id || d.name) || item("card tool");
        const out = card.querySelector(".outcome") || card.appendChild(document.createElement("div"));
        const ms = card.started ? ` · ${Math.round(performance.now() - card.started)} ms` : "";
        out.className = `outcome ${d.ok ? "ok" : "error"}`;
        out.textContent = `${d.ok ? "ok" : "error"}${ms}: ${JSON.stringify(d.outcome).slice(0, 600)}`;
        if (d.ok) this.collectSources(d.outcome);
        break;
      }
      case FRAME.PENDING: {
        // The call's own card waits for the decision; the pending card tells it the outcome.
        const args = JSON.stringify(d.arguments);
        const call = [...this.tools.values()].find(
          (c) => c.dataset.tool === d.toolName && c.dataset.args === args && !c.dataset.pending,
        );
        if (call) {
          call.dataset.pending = "true";
          call.querySelector(".outcome").textContent = "waiting for your approval";
        }
        pendingCard(d, call);
        this.text = null;
        break;
      }
      case FRAME.DONE:
        if (d.conversationId != null) setConversation(d.conversationId);
        refreshConversations();
        for (const bubble of this.bubbles) linkCitations(bubble, this.sources);
        this.finished = true;
        break;
      case FRAME.ERROR:
        showError(`The turn failed: ${d.message || data}`);
        this.finished = true;
        break;
      default:
        break;
    }
  }
}

/**
 * Turns each `[label]` in `bubble` that names a chunk of `sources` into a marker; the marker
 * shows the chunk's text and source below the reply, and hides them again.
 */
function linkCitations(bubble, sources) {
  if (!sources.size) return;
  const text = bubble.textContent;
  const parts = [];
  let last = 0;
  for (const m of text.matchAll(/\[([^\[\]]+)\]/g)) {
    const source = sources.get(m[1]);
    if (!source) continue;
    parts.push(document.createTextNode(text.slice(last, m.index)));
    const marker = document.createElement("button");
    marker.type = "button";
    marker.className = "cite";
    marker.textContent = m[0];
    marker.setAttribute("aria-expanded", "false");
    marker.addEventListener("click", () => toggleCited(bubble, marker, m[1], source));
    parts.push(marker);
    last = m.index + m[0].length;
  }
  if (!parts.length) return;
  parts.push(document.createTextNode(text.slice(last)));
  bubble.replaceChildren(...parts);
}

function toggleCited(bubble, marker, label, source) {
  const open = bubble.querySelector(`blockquote.cited[data-label="${CSS.escape(label)}"]`);
  if (open) {
    open.remove();
    marker.setAttribute("aria-expanded", "false");
    return;
  }
  const quote = document.createElement("blockquote");
  quote.className = "cited";
  quote.dataset.label = label;
  const head = document.createElement("div");
  head.className = "muted";
  head.textContent = `${label}${source.source ? ` · ${source.source}` : ""}`;
  const body = document.createElement("div");
  body.textContent = source.content;
  quote.append(head, body);
  bubble.append(quote);
  marker.setAttribute("aria-expanded", "true");
}

/** What a question's pending action names instead of a tool (never a tool's name). */
const QUESTION = "@ask";

/** A pending write action with its own Approve and Reject; a question with its answer box. */
function pendingCard(action, call) {
  if (action.toolName === QUESTION) return questionCard(action);
  const card = item("card pending");
  card.dataset.messageId = action.messageId;
  card.innerHTML = `<div><span class="name"></span> <span class="muted">needs your approval</span></div>
    <div class="description"></div><pre class="args"></pre>
    <div class="actions"><button type="button" class="approve">Approve</button><button type="button" class="reject">Reject</button></div>
    <div class="decision" aria-live="polite"></div>`;
  card.querySelector(".name").textContent = action.toolName;
  card.querySelector(".description").textContent = action.description;
  card.querySelector(".args").textContent = JSON.stringify(action.arguments, null, 1);
  card.querySelector(".approve").addEventListener("click", () => decide(card, action, true, call));
  card.querySelector(".reject").addEventListener("click", () => decide(card, action, false, call));
}

async function decide(card, action, confirmed, call) {
  const buttons = card.querySelectorAll("button");
  buttons.forEach((b) => { b.disabled = true; });
  const note = card.querySelector(".decision");
  note.textContent = confirmed ? "Approving…" : "Rejecting…";
  showError("");
  try {
    const response = await fetch("/api/chatbot/confirm", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ ...who(), conversationId, messageId: action.messageId, confirmed }),
    });
    if (!response.ok) {
      note.textContent = "";
      buttons.forEach((b) => { b.disabled = false; });
      showError(await failure(response));
      return;
    }
    const answer = await response.json();
    note.textContent = confirmed ? "Approved" : "Rejected";
    card.classList.add(confirmed ? "approved" : "rejected");
    if (call) {
      const out = call.querySelector(".outcome");
      out.className = `outcome ${confirmed ? "ok" : "error"}`;
      out.textContent = confirmed ? "approved: it runs once the turn goes on" : "rejected: it did not run";
    }
    if (answer.message) item("msg assistant", answer.message);
    if (answer.pendingAction && !document.querySelector(`[data-message-id="${answer.pendingAction.messageId}"]`)) {
      pendingCard(answer.pendingAction);
    }
  } catch (e) {
    note.textContent = "";
    buttons.forEach((b) => { b.disabled = false; });
    showError(`The service cannot be reached: ${e.message}`);
  }
}

/**
 * A question the agent asked: a choice for an `enum` form, a JSON box for another form, else a
 * text box; Answer sends it to /api/chatbot/answer, Skip declines it.
 */
function questionCard(action) {
  const card = item("card pending question");
  card.dataset.messageId = action.messageId;
  const form = (action.arguments || {}).form;
  const choices = form && Array.isArray(form.enum) ? form.enum : null;
  card.innerHTML = `<div><span class="muted">the agent asks</span></div><div class="description"></div>
    <div class="reply-box"></div>
    <div class="actions"><button type="button" class="answer">Answer</button><button type="button" class="skip">Skip</button></div>
    <div class="decision" aria-live="polite"></div>`;
  card.querySelector(".description").textContent = action.description;
  let input;
  if (choices) {
    input = document.createElement("select");
    for (const c of choices) {
      const option = document.createElement("option");
      option.value = JSON.stringify(c);
      option.textContent = typeof c === "string" ? c : JSON.stringify(c);
      input.append(option);
    }
  } else {
    input = document.createElement(form ? "textarea" : "input");
    input.placeholder = form ? "your answer, as JSON" : "your answer";
  }
  input.className = "answer-input";
  input.setAttribute("aria-label", action.description);
  card.querySelector(".reply-box").append(input);
  const value = () => {
    if (choices) return JSON.parse(input.value);
    if (!form) return input.value;
    try {
      return JSON.parse(input.value);
    } catch {
      return input.value;
    }
  };
  card.querySelector(".answer").addEventListener("click", () =>
    settle(card, "/api/chatbot/answer", { messageId: action.messageId, answer: value() }, "Answered", "answered"),
  );
  card.querySelector(".skip").addEventListener("click", () =>
    settle(card, "/api/chatbot/confirm", { messageId: action.messageId, confirmed: false }, "Skipped", "rejected"),
  );
}

/** Sends a question's answer (or its refusal) and shows what the run said next. */
async function settle(card, url, body, done, mark) {
  const buttons = card.querySelectorAll("button");
  buttons.forEach((b) => { b.disabled = true; });
  const note = card.querySelector(".decision");
  note.textContent = "Sending…";
  showError("");
  try {
    const response = await fetch(url, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ ...who(), conversationId, ...body }),
    });
    if (!response.ok) {
      note.textContent = "";
      buttons.forEach((b) => { b.disabled = false; });
      showError(await failure(response));
      return;
    }
    const reply = await response.json();
    note.textContent = done;
    card.classList.add(mark);
    if ("answer" in body) {
      item("msg user", typeof body.answer === "string" ? body.answer : JSON.stringify(body.answer));
    }
    if (reply.message) item("msg assistant", reply.message);
    if (reply.pendingAction && !document.querySelector(`[data-message-id="${reply.pendingAction.messageId}"]`)) {
      pendingCard(reply.pendingAction);
    }
  } catch (e) {
    note.textContent = "";
    buttons.forEach((b) => { b.disabled = false; });
    showError(`The service cannot be reached: ${e.message}`);
  }
}

/** Follows a run's frames after `lastId` (a dropped stream), once per drop. */
async function resume(turn) {
  const [runId] = turn.lastId.split(":");
  const { tenantId, userId } = who();
  const url = `/api/chatbot/runs/${encodeURIComponent(runId)}/events?tenantId=${tenantId}&userId=${userId}`;
  const response = await fetch(url, { headers: { ...headers(), "Last-Event-ID": turn.lastId } });
  if (!response.ok) throw new Error(await failure(response));
  await readFrames(response, (f) => turn.frame(f));
}

async function send(message) {
  busy = true;
  $("send").disabled = true;
  showError("");
  item("msg user", message);
  const turn = new Turn();
  const body = { ...who(), conversationId, message, agent: $("agent").value || undefined, toolEvents: true };
  const ctx = context();
  if (ctx) body.context = ctx;
  try {
    const response = await fetch("/api/chatbot/stream", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!response.ok) {
      showError(await failure(response));
      return;
    }
    let attempts = 0;
    for (;;) {
      try {
        if (attempts === 0) await readFrames(response, (f) => turn.frame(f));
        else await resume(turn);
      } catch (e) {
        if (!turn.lastId || attempts >= 3) throw e;
      }
      if (turn.finished || !turn.lastId || attempts >= 3) break;
      attempts += 1;
      $("conversation-label").textContent = "Reconnecting…";
      await new Promise((r) => setTimeout(r, 300 * attempts));
    }
    if (!turn.finished) showError("The stream ended before the turn finished.");
  } catch (e) {
    showError(`The service cannot be reached: ${e.message}`);
  } finally {
    setConversation(conversationId);
    busy = false;
    $("send").disabled = false;
  }
}

/** The inspector: the conversation's checkpoints as a timeline, and the state at each. */
function ownerQuery() {
  const { tenantId, userId } = who();
  return `tenantId=${tenantId}&userId=${userId}`;
}

/** A checkpoint's next node(s) as text. */
const nextText = (next) => (Array.isArray(next) ? next.join(", ") : next || "");

async function loadCheckpoints() {
  const list = $("checkpoints");
  const view = $("checkpoint-state");
  list.replaceChildren();
  view.textContent = "";
  $("fork").hidden = true;
  shownSeq = null;
  showError("");
  if (conversationId == null) {
    list.append(Object.assign(document.createElement("li"), { textContent: "No conversation yet." }));
    $("run-tokens").textContent = "";
    return;
  }
  try {
    const response = await fetch(`/api/chatbot/conversations/${conversationId}/checkpoints?${ownerQuery()}`, { headers: headers() });
    if (!response.ok) {
      showError(await failure(response));
      return;
    }
    const { checkpoints } = await response.json();
    const last = checkpoints.length ? checkpoints[checkpoints.length - 1].run_id : null;
    await drawGraph(new Set(checkpoints.filter((cp) => cp.run_id === last && cp.node).map((cp) => cp.node)));
    // Where the last run's time went, node by node: the time from a checkpoint to the next
    // one of the same run is the next node's (for the ReAct agent, `agent` is the model's time
    // and `tools` the tools').
    const spent = new Map();
    checkpoints.forEach((cp, i) => {
      const next = checkpoints[i + 1];
      if (cp.run_id !== last || !next || next.run_id !== last || !next.node) return;
      spent.set(next.node, (spent.get(next.node) || 0) + (next.created_at_ms - cp.created_at_ms));
    });
    $("run-times").textContent = spent.size
      ? `Last run, time per node: ${[...spent].map(([n, ms]) => `${n} ${ms} ms`).join(" · ")}`
      : "";
    await loadTokens();
    checkpoints.forEach((cp, i) => {
      const next = checkpoints[i + 1];
      const ms = next && next.run_id === cp.run_id ? next.created_at_ms - cp.created_at_ms : null;
      const li = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "checkpoint";
      button.dataset.seq = cp.seq;
      button.textContent = `#${cp.seq} ${cp.kind}${cp.node ? ` · ${cp.node}` : ""}${nextText(cp.next) ? ` → ${nextText(cp.next)}` : ""}${ms != null ? ` · ${ms} ms` : ""}`;
      button.addEventListener("click", () => showCheckpoint(cp.seq));
      li.append(button);
      list.append(li);
    });
  } catch (e) {
    showError(`The service cannot be reached: ${e.message}`);
  }
}

/** The tokens the conversation's turns used, as the model reported them (a store that keeps
 *  no usage answers an error: nothing is shown). */
async function loadTokens() {
  const shown = $("run-tokens");
  shown.textContent = "";
  const response = await fetch(`/api/chatbot/conversations/${conversationId}/usage?${ownerQuery()}`, { headers: headers() });
  if (!response.ok) return;
  const { turns, total } = await response.json();
  if (!turns.length) {
    shown.textContent = "No model reported its tokens for this conversation.";
    return;
  }
  const calls = turns.reduce((n, t) => n + t.calls, 0);
  const last = turns[turns.length - 1];
  shown.textContent =
    `Tokens, as the model reported them: ${total.promptTokens} prompt (${total.cachedPromptTokens} cached) + ` +
    `${total.completionTokens} completion in ${calls} model calls; the last: ${last.promptTokens} + ${last.completionTokens} (${last.model})`;
}

/** The person's memories (docs/memory.md): every item the agents keep about them, under
 *  `memories`, through the store's routes, each with a button that forgets it. */
function storeHeaders() {
  const { tenantId, userId } = who();
  return { ...headers(), "X-Tenant-Id": String(tenantId), "X-User-Id": String(userId) };
}

async function loadMemories() {
  const list = $("memory-items");
  const status = $("memories-status");
  list.replaceChildren();
  status.textContent = "";
  showError("");
  try {
    const response = await fetch("/store/items/search", {
      method: "POST",
      headers: storeHeaders(),
      body: JSON.stringify({ namespace_prefix: ["memories"], limit: 100, refresh_ttl: false }),
    });
    if (!response.ok) {
      showError(await failure(response));
      return;
    }
    const { items } = await response.json();
    status.textContent = items.length
      ? `${items.length} remembered item${items.length === 1 ? "" : "s"} about this person`
      : "Nothing is remembered about this person.";
    for (const it of items) {
      const li = document.createElement("li");
      li.className = "memory";
      li.dataset.key = it.key;
      const text = typeof it.value?.text === "string" ? it.value.text : JSON.stringify(it.value);
      const where = Object.assign(document.createElement("span"), { className: "muted", textContent: `${it.namespace.join(" / ")} · ` });
      const what = Object.assign(document.createElement("span"), { className: "memory-text", textContent: text });
      const forget = Object.assign(document.createElement("button"), { type: "button", className: "forget", textContent: "Forget" });
      forget.addEventListener("click", () => forgetMemory(it.namespace, it.key));
      li.append(where, what, " ", forget);
      list.append(li);
    }
  } catch (e) {
    showError(`The service cannot be reached: ${e.message}`);
  }
}

async function forgetMemory(namespace, key) {
  const response = await fetch("/store/items", {
    method: "DELETE",
    headers: storeHeaders(),
    body: JSON.stringify({ namespace, key }),
  });
  if (!response.ok) {
    showError(await failure(response));
    return;
  }
  await loadMemories();
}

/** The retrieval view: `POST /search`, each result with its rank and score in every list. */
async function search() {
  const table = $("search-results");
  const rows = table.querySelector("tbody");
  showError("");
  const body = { query: $("search-query").value.trim(), top_k: Number($("search-top").value) || 5 };
  if ($("search-kb").value.trim()) body.kb = $("search-kb").value.trim();
  if ($("search-mode").value) body.mode = $("search-mode").value;
  const filters = pairsOf("search-filters");
  if (filters) body.filters = filters;
  try {
    const response = await fetch("/search", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok || answer.ok === false) {
      showError(`The search failed (${response.status}): ${answer.error || response.statusText}`);
      return;
    }
    const cell = (text) => Object.assign(document.createElement("td"), { textContent: text });
    const rank = (r) => (r ? `${r.rank} · ${Number(r.score).toFixed(3)}` : "—");
    rows.replaceChildren(...(answer.results || []).map((r, i) => {
      const tr = document.createElement("tr");
      const ranks = r.ranks || {};
      tr.append(cell(String(i + 1)), cell(Number(r.score).toFixed(4)), cell(rank(ranks.bm25)), cell(rank(ranks.dense)),
        cell((r.metadata && r.metadata.citation) || ""), cell((r.content || "").slice(0, 240)));
      return tr;
    }));
    table.hidden = false;
  } catch (e) {
    showError(`The service cannot be reached: ${e.message}`);
  }
}

/** The agent's graph, the nodes of `ran` (the last run's) marked. */
async function drawGraph(ran) {
  const box = $("graph");
  const agent = $("agent").value;
  if (!agent) return;
  const response = await fetch(`/api/chatbot/agents/${encodeURIComponent(agent)}/graph.svg`, { headers: headers() });
  if (!response.ok) {
    showError(await failure(response));
    return;
  }
  const doc = new DOMParser().parseFromString(await response.text(), "image/svg+xml");
  const svg = document.importNode(doc.documentElement, true);
  for (const node of svg.querySelectorAll("g.node")) {
    if (ran.has(node.dataset.node)) node.classList.add("ran");
  }
  box.replaceChildren(svg);
}

async function fetchCheckpoint(seq) {
  const response = await fetch(`/api/chatbot/conversations/${conversationId}/checkpoints/${seq}?${ownerQuery()}`, { headers: headers() });
  if (!response.ok) throw new Error(await failure(response));
  return response.json();
}

let shownSeq = null;

/** The state at `seq`, and what it added to the one before. */
async function showCheckpoint(seq) {
  const view = $("checkpoint-state");
  showError("");
  try {
    const cp = await fetchCheckpoint(seq);
    shownSeq = seq;
    $("fork").hidden = false;
    const before = seq > 1 ? await fetchCheckpoint(seq - 1).catch(() => null) : null;
    const now = (cp.state && cp.state.messages) || [];
    const was = (before && before.state && before.state.messages) || [];
    const added = now.slice(was.length);
    view.textContent = `Checkpoint #${seq}${nextText(cp.next) ? `, next: ${nextText(cp.next)}` : ""}\n` +
      `Added since #${seq - 1}: ${added.length} message(s)\n${added.map((m) => `+ ${JSON.stringify(m)}`).join("\n")}\n\n` +
      `State:\n${JSON.stringify(cp.state, null, 1)}`;
  } catch (e) {
    showError(e.message);
  }
}

/** Forks the conversation at the checkpoint shown into a new one and continues there. */
async function forkHere() {
  if (conversationId == null || shownSeq == null) return;
  showError("");
  const from = conversationId;
  const seq = shownSeq;
  try {
    const response = await fetch(`/api/chatbot/conversations/${from}/fork`, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ ...who(), seq }),
    });
    if (!response.ok) {
      showError(await failure(response));
      return;
    }
    const { conversationId: forked } = await response.json();
    const cp = await fetchCheckpoint(seq).catch(() => null);
    $("log").replaceChildren();
    setConversation(forked);
    item("muted fork-note", `Forked from conversation ${from} at checkpoint #${seq}; the next message continues from here.`);
    const messages = (cp && cp.state && cp.state.messages) || [];
    for (const m of messages) {
      if ((m.role === "user" || m.role === "assistant") && m.content) item(`msg ${m.role}`, m.content);
    }
    $("checkpoints").replaceChildren();
    $("checkpoint-state").textContent = "";
    $("fork").hidden = true;
    shownSeq = null;
    refreshConversations();
    $("message").focus();
  } catch (e) {
    showError(`The service cannot be reached: ${e.message}`);
  }
}

/** The user's conversations, newest first: each opens (to continue it) or is deleted. */
async function refreshConversations() {
  const list = $("conversation-list");
  try {
    const response = await fetch(`/api/chatbot/conversations?${ownerQuery()}&limit=20`, { headers: headers() });
    if (!response.ok) return;
    const { conversations } = await response.json();
    list.replaceChildren(...conversations.map((c) => {
      const li = document.createElement("li");
      li.dataset.conversation = c.id;
      if (c.id === conversationId) li.classList.add("current");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "open";
      open.textContent = `#${c.id} ${c.title || "(no message yet)"} · ${c.agent}`;
      open.addEventListener("click", () => openConversation(c));
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "delete";
      remove.textContent = "Delete";
      remove.setAttribute("aria-label", `Delete conversation ${c.id}`);
      remove.addEventListener("click", () => deleteConversation(c.id));
      li.append(open, remove);
      return li;
    }));
  } catch (_) {
    // The list is a convenience: a failed refresh leaves the last one.
  }
}

/** Shows conversation `c`'s messages (from its last checkpoint) and continues it. */
async function openConversation(c) {
  showError("");
  setConversation(c.id);
  if ([...$("agent").options].some((o) => o.value === c.agent)) $("agent").value = c.agent;
  $("log").replaceChildren();
  try {
    const response = await fetch(`/api/chatbot/conversations/${c.id}/checkpoints?${ownerQuery()}`, { headers: headers() });
    if (!response.ok) {
      showError(await failure(response));
      return;
    }
    const { checkpoints } = await response.json();
    if (checkpoints.length) {
      const cp = await fetchCheckpoint(checkpoints[checkpoints.length - 1].seq);
      for (const m of (cp.state && cp.state.messages) || []) {
        if ((m.role === "user" || m.role === "assistant") && m.content) item(`msg ${m.role}`, m.content);
      }
    }
  } catch (e) {
    showError(e.message);
  }
  refreshConversations();
}

async function deleteConversation(id) {
  showError("");
  try {
    const response = await fetch(`/api/chatbot/conversations/${id}?${ownerQuery()}`, { method: "DELETE", headers: headers() });
    if (!response.ok && response.status !== 404) {
      showError(await failure(response));
      return;
    }
    if (id === conversationId) {
      setConversation(null);
      $("log").replaceChildren();
    }
  } catch (e) {
    showError(`The service cannot be reached: ${e.message}`);
  }
  refreshConversations();
}

function start() {
  const select = $("agent");
  if (config.tenantSlug) $("tenant-slug").value = config.tenantSlug;
  for (const name of config.agents || []) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = name;
    if (name === config.defaultAgent) option.selected = true;
    select.append(option);
  }
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("message").value.trim();
    if (!text || busy) return;
    $("message").value = "";
    send(text);
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("new-conversation").addEventListener("click", () => {
    setConversation(null);
    $("log").replaceChildren();
    showError("");
    refreshConversations();
    $("message").focus();
  });
  for (const id of ["tenant-slug", "tenant-id", "user-id", "api-key"]) $(id).addEventListener("change", refreshConversations);
  refreshConversations();
  $("load-checkpoints").addEventListener("click", loadCheckpoints);
  $("load-memories").addEventListener("click", loadMemories);
  $("fork").addEventListener("click", forkHere);
  $("search-form").addEventListener("submit", (e) => {
    e.preventDefault();
    search();
  });
  document.body.dataset.ready = "true";
}

start();
