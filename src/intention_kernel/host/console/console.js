// intention-kernel operator console: plain JavaScript, no build step.
//
// Everything shown comes from the host's own API. Text from a thread is only ever
// inserted with textContent, never as HTML. Every turn the console sends carries a
// fresh turn ID, reused if that same delivery has to be retried: a retry after a
// lost response then returns the stored result instead of running the turn again.
//
// Without ?thread=ID the console opens on the queue: across the token's threads, the
// writes whose outcome is unknown (uncertain, or left prepared) and the confirmations
// waiting for an answer, each linking to its thread.
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
  // The deadline (UTC in the JSON), in the reader's local time; an answer after it runs nothing.
  const expires = interaction.expires_at ? new Date(interaction.expires_at) : null;
  $("confirmation-expires-label").hidden = !expires;
  $("confirmation-expires").hidden = !expires;
  $("confirmation-expires").textContent = expires ? expires.toLocaleString() : "";
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

// What an operator typed into each reconcile form, by receipt: a refresh re-renders the
// list, and a refused resolution must not cost the operator their input.
function receiptId(receipt) {
  return `${receipt.thread_id}\u0000${receipt.key}`;
}

function readDrafts() {
  const drafts = new Map();
  for (const item of $("receipts").children) {
    const form = item.querySelector("form");
    const checked = form.querySelector("input[name=applied]:checked");
    drafts.set(item.dataset.id, {
      applied: checked ? checked.value : null,
      value: form.elements.value.value,
      note: form.elements.note.value,
      error: form.querySelector(".form-error").textContent,
    });
  }
  return drafts;
}

function restoreDraft(form, draft) {
  if (!draft) return;
  for (const radio of form.querySelectorAll("input[name=applied]")) {
    radio.checked = radio.value === draft.applied;
  }
  form.elements.value.value = draft.value;
  form.elements.note.value = draft.note;
  showFormError(form, draft.error);
}

function showFormError(form, message) {
  const error = form.querySelector(".form-error");
  error.textContent = message || "";
  error.hidden = !message;
}

// A receipt's key, status badge and cause (with its attempt and turn) in a list item;
// causeSelector names the item's element for the cause.
function describeReceipt(item, receipt, causeSelector) {
  item.querySelector(".key").textContent = receipt.key;
  const badge = item.querySelector(".badge");
  badge.textContent = receipt.status;
  badge.className = `badge ${receipt.status}`;
  item.querySelector(causeSelector).textContent =
    `${receiptCause(receipt)} · attempt ${receipt.attempt} · turn ${receipt.turn_id}`;
}

function renderReceipts(receipts) {
  $("no-receipts").hidden = receipts.length > 0;
  const template = $("receipt-template");
  const drafts = readDrafts();
  $("receipts").replaceChildren(
    ...receipts.map((receipt) => {
      const item = template.content.firstElementChild.cloneNode(true);
      item.dataset.id = receiptId(receipt);
      item.dataset.key = receipt.key;
      item.dataset.status = receipt.status;
      describeReceipt(item, receipt, ".error");
      const form = item.querySelector("form");
      restoreDraft(form, drafts.get(item.dataset.id));
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        resolveReceipt(receipt, form);
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
  for (const id of ["message", "send", "accept", "reject"]) $(id).disabled = !enabled;
}

// The receipts an operator can resolve: uncertain ones, and prepared ones left by an
// attempt that died before it could record the outcome (the store resolves under the
// thread's lock, so never one that a live attempt is still working on). Oldest first.
const RESOLVABLE = ["uncertain", "prepared"];

// The resolvable receipts of the open thread, or of every thread the token sees.
async function resolvableReceipts(threadId) {
  const thread = threadId ? `thread_id=${encodeURIComponent(threadId)}&` : "";
  const lists = await Promise.all(
    RESOLVABLE.map((status) => api(`v1/receipts?${thread}status=${status}`)),
  );
  return lists
    .flatMap((list) => list.receipts)
    .sort((a, b) => {
      const order = String(a.created_at || "").localeCompare(String(b.created_at || ""));
      return order || a.key.localeCompare(b.key);
    });
}

function threadLink(threadId) {
  const link = el("a", "thread-link", `Open thread ${threadId}`);
  link.href = `console?thread=${encodeURIComponent(threadId)}`;
  return link;
}

function renderQueue(receipts, interactions) {
  $("queue-no-receipts").hidden = receipts.length > 0;
  $("queue-receipts").replaceChildren(
    ...receipts.map((receipt) => {
      const item = $("queue-receipt-template").content.firstElementChild.cloneNode(true);
      item.dataset.thread = receipt.thread_id;
      describeReceipt(item, receipt, ".cause");
      item.querySelector(".thread-link").replaceWith(threadLink(receipt.thread_id));
      return item;
    }),
  );
  $("queue-no-interactions").hidden = interactions.interactions.length > 0;
  $("queue-more").hidden = !interactions.next_after;
  $("queue-interactions").replaceChildren(
    ...interactions.interactions.map((pending) => {
      const item = $("queue-interaction-template").content.firstElementChild.cloneNode(true);
      item.dataset.thread = pending.thread_id;
      item.querySelector(".prompt").textContent = pending.interaction.prompt;
      item.querySelector(".capability").textContent =
        `${pending.interaction.capability_id} · ${pending.interaction.kind} · v${pending.version}` +
        (pending.interaction.expires_at
          ? ` · answer by ${new Date(pending.interaction.expires_at).toLocaleString()}`
          : "");
      item.querySelector(".thread-link").replaceWith(threadLink(pending.thread_id));
      return item;
    }),
  );
}

async function refreshQueue() {
  try {
    const [receipts, interactions] = await Promise.all([
      resolvableReceipts(null),
      api("v1/interactions?limit=100"),
    ]);
    renderQueue(receipts, interactions);
  } catch (error) {
    showBanner(describeError(error));
  }
}

async function refresh() {
  $("queue").hidden = Boolean(state.threadId);
  $("main").hidden = !state.threadId;
  if (!state.threadId) return refreshQueue();
  try {
    const [thread, receipts] = await Promise.all([
      api(threadPath()).catch((error) => {
        if (error instanceof ProblemError && error.status === 404) return null;
        throw error;
      }),
      resolvableReceipts(state.threadId),
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

// The resolution the form asks for, or the reason it cannot be sent: checked here, so
// that a typo in the value is never mistaken for a failure of the host.
function readResolution(receipt, form) {
  const data = new FormData(form);
  const choice = data.get("applied");
  if (choice === null) return { error: "Choose applied or not applied." };
  const applied = choice === "true";
  const note = String(data.get("note") || "").trim();
  if (!note) return { error: "Write a note: what you checked, and where." };
  let value = null;
  if (applied) {
    const text = String(data.get("value") || "").trim();
    if (!text) {
      return {
        error:
          "An applied write needs its value, as the provider returned it, in JSON " +
          "(null if it returned nothing): later turns receive it.",
      };
    }
    try {
      value = JSON.parse(text);
    } catch {
      return { error: 'The value is invalid JSON. Write it as JSON, such as {"id": "ch_1"} or null.' };
    }
  }
  return { body: { thread_id: receipt.thread_id, key: receipt.key, applied, value, note } };
}

function resolveReceipt(receipt, form) {
  const { body, error } = readResolution(receipt, form);
  showFormError(form, error);
  if (error) return undefined;
  return run(async () => {
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
  $("refresh").addEventListener("click", () => {
    sessionStorage.setItem("intention-kernel.token", $("token").value);
    run(async () => {});
  });
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
  } else {
    run(async () => {});
  }
});
