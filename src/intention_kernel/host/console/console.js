// intention-kernel operator console: plain JavaScript, no build step.
//
// Everything shown comes from the host's own API. Text from a thread is only ever
// inserted with textContent, never as HTML. Every turn the console sends carries a
// fresh turn ID, reused if that same delivery has to be retried: a retry after a
// lost response then returns the stored result instead of running the turn again.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { threadId: "", interactionId: null, busy: false };

class ProblemError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function headers() {
  const result = { "Content-Type": "application/json", Accept: "application/json" };
  const token = $("token").value.trim();
  if (token) result.Authorization = `Bearer ${token}`;
  return result;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers() });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new ProblemError(response.status, body);
  return body;
}

function threadPath(suffix = "") {
  return `v1/threads/${encodeURIComponent(state.threadId)}${suffix}`;
}

function newTurnId() {
  // crypto.getRandomValues works outside secure contexts too (randomUUID does not).
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One delivery, one turn ID: retried (same ID) on network errors and 503s only.
async function postTurn(body) {
  const request = { ...body, turn_id: newTurnId() };
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await api(threadPath("/turns"), { method: "POST", body: JSON.stringify(request) });
    } catch (error) {
      const retryable = !(error instanceof ProblemError) || error.status === 503;
      if (!retryable || attempt >= 3) throw error;
      await sleep(500 * attempt);
    }
  }
}

function showBanner(message, kind = "error") {
  const banner = $("banner");
  banner.textContent = message;
  banner.className = `banner ${kind === "info" ? "info" : ""}`;
  banner.hidden = false;
}

function clearBanner() {
  $("banner").hidden = true;
}

function describeError(error) {
  if (error instanceof ProblemError) {
    const title = error.problem.title || `HTTP ${error.status}`;
    return error.problem.detail ? `${title}: ${error.problem.detail}` : title;
  }
  return `The host could not be reached (${error.message}).`;
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function compact(value) {
  return typeof value === "string" ? value : JSON.stringify(value);
}

function renderMessages(messages) {
  const list = $("messages");
  list.replaceChildren(
    ...messages.map((message) => {
      const item = el("li", `message ${message.role}`);
      item.append(el("span", "who", `${message.role} · ${message.turn_id}`));
      item.append(el("span", "text", message.content));
      return item;
    }),
  );
  list.scrollTop = list.scrollHeight;
}

function renderInteraction(interaction) {
  state.interactionId = interaction ? interaction.id : null;
  $("confirmation").hidden = !interaction;
  if (!interaction) return;
  $("confirmation-prompt").textContent = interaction.prompt;
  $("confirmation-capability").textContent = interaction.capability_id;
  // One line per field: what the person is asked to approve, readable at a glance.
  $("confirmation-input").textContent = Object.entries(interaction.input)
    .map(([key, value]) => `${key}: ${compact(value)}`)
    .join("\n");
}

function renderFacts(facts) {
  $("no-facts").hidden = facts.length > 0;
  $("facts").hidden = facts.length === 0;
  $("facts").tBodies[0].replaceChildren(
    ...facts.map((fact) => {
      const row = el("tr");
      const key = el("td");
      key.append(el("code", "", fact.key), el("span", "muted", ` v${fact.version}`));
      const value = el("td");
      value.append(el("pre", "", compact(fact.value)));
      const evidence = fact.evidence;
      const parts = [evidence.capability_id, `turn ${evidence.turn_id}`, `step ${evidence.step_id}`];
      if (evidence.receipt_ids.length) parts.push(`receipts ${evidence.receipt_ids.join(", ")}`);
      if (evidence.derived_from.length) {
        parts.push(`from ${evidence.derived_from.map((r) => `${r.key} v${r.version}`).join(", ")}`);
      }
      row.append(key, value, el("td", "evidence", parts.join(" · ")));
      return row;
    }),
  );
}

// Why an operator is asked: an uncertain receipt says what went wrong; a prepared one
// was left by an attempt that never reported back (the process died mid-effect).
function receiptCause(receipt) {
  if (receipt.error) return receipt.error;
  return receipt.status === "prepared"
    ? "prepared by an attempt that did not finish"
    : "outcome unknown";
}

function renderReceipts(receipts) {
  $("no-receipts").hidden = receipts.length > 0;
  const template = $("receipt-template");
  $("receipts").replaceChildren(
    ...receipts.map((receipt) => {
      const item = template.content.firstElementChild.cloneNode(true);
      item.dataset.key = receipt.key;
      item.dataset.status = receipt.status;
      item.querySelector(".key").textContent = receipt.key;
      const badge = item.querySelector(".badge");
      badge.textContent = receipt.status;
      badge.className = `badge ${receipt.status}`;
      item.querySelector(".error").textContent =
        `${receiptCause(receipt)} · attempt ${receipt.attempt} · turn ${receipt.turn_id}`;
      item.querySelector("form").addEventListener("submit", (event) => {
        event.preventDefault();
        resolveReceipt(receipt, new FormData(event.target));
      });
      return item;
    }),
  );
}

function renderTurn(result) {
  $("last-turn").hidden = false;
  $("last-turn-id").textContent = result.turn_id;
  const items = result.steps.map((step) => {
    const item = el("li");
    item.append(el("code", "", step.capability_id), el("span", `badge ${step.status}`, step.status));
    if (step.error) item.append(el("span", "muted", step.error));
    return item;
  });
  if (result.replayed) items.unshift(el("li", "badge replayed", "replayed: nothing ran again"));
  if (!items.length) items.push(el("li", "muted", "no steps"));
  $("steps").replaceChildren(...items);
}

function setEnabled(enabled) {
  for (const id of ["message", "send", "accept", "reject", "refresh"]) $(id).disabled = !enabled;
}

// The receipts an operator can resolve: uncertain ones, and prepared ones left by an
// attempt that died before it could record the outcome (the store resolves under the
// thread's lock, so never one that a live attempt is still working on). Oldest first.
const RESOLVABLE = ["uncertain", "prepared"];

async function resolvableReceipts() {
  const thread = encodeURIComponent(state.threadId);
  const lists = await Promise.all(
    RESOLVABLE.map((status) => api(`v1/receipts?thread_id=${thread}&status=${status}`)),
  );
  return lists
    .flatMap((list) => list.receipts)
    .sort((a, b) => {
      const order = String(a.created_at || "").localeCompare(String(b.created_at || ""));
      return order || a.key.localeCompare(b.key);
    });
}

async function refresh() {
  if (!state.threadId) return;
  try {
    const [thread, receipts] = await Promise.all([
      api(threadPath()).catch((error) => {
        if (error instanceof ProblemError && error.status === 404) return null;
        throw error;
      }),
      resolvableReceipts(),
    ]);
    $("empty-thread").hidden = Boolean(thread);
    $("empty-thread").textContent = "No turn on this thread yet: send the first message.";
    $("version").textContent = thread ? `· v${thread.version}` : "";
    renderMessages(thread ? thread.messages : []);
    renderInteraction(thread ? thread.interaction : null);
    renderFacts(thread ? thread.facts : []);
    renderReceipts(receipts);
    if (thread && !thread.compatible) {
      showBanner("This thread was written by an agent this host does not declare compatible.");
    }
  } catch (error) {
    showBanner(describeError(error));
  }
}

async function run(action) {
  if (state.busy) return;
  state.busy = true;
  setEnabled(false);
  clearBanner();
  try {
    await action();
  } catch (error) {
    showBanner(describeError(error));
  } finally {
    state.busy = false;
    setEnabled(Boolean(state.threadId));
    await refresh();
  }
}

function answer(decision) {
  return run(async () => {
    const result = await postTurn({ answer: { interaction_id: state.interactionId, decision } });
    renderTurn(result);
  });
}

function resolveReceipt(receipt, form) {
  return run(async () => {
    const applied = form.get("applied") === "true";
    const text = String(form.get("value") || "").trim();
    let value = null;
    if (applied && text) {
      try {
        value = JSON.parse(text);
      } catch {
        throw new Error("the value is not valid JSON");
      }
    }
    const note = String(form.get("note") || "").trim() || null;
    const body = { thread_id: receipt.thread_id, key: receipt.key, applied, value, note };
    const resolved = await api("v1/receipts/resolve", { method: "POST", body: JSON.stringify(body) });
    showBanner(`${resolved.key} is now ${resolved.status}.`, "info");
  });
}

function openThread(threadId) {
  state.threadId = threadId;
  const url = new URL(window.location.href);
  url.searchParams.set("thread", threadId);
  window.history.replaceState(null, "", url);
  sessionStorage.setItem("intention-kernel.token", $("token").value);
  $("last-turn").hidden = true;
  return run(async () => {});
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").value = sessionStorage.getItem("intention-kernel.token") || "";
  $("thread-form").addEventListener("submit", (event) => {
    event.preventDefault();
    openThread($("thread-id").value.trim());
  });
  $("refresh").addEventListener("click", () => run(async () => {}));
  $("accept").addEventListener("click", () => answer("accept"));
  $("reject").addEventListener("click", () => answer("reject"));
  $("send-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = $("message").value.trim();
    if (!message) return;
    run(async () => {
      const result = await postTurn({ message });
      $("message").value = "";
      renderTurn(result);
    });
  });
  const initial = new URL(window.location.href).searchParams.get("thread");
  if (initial) {
    $("thread-id").value = initial;
    openThread(initial);
  }
});
