// intention-kernel operator console: plain JavaScript, no build step.
//
// Everything shown comes from the host's own API. Text from a thread is only ever
// inserted with textContent, never as HTML. Every turn the console sends carries a
// fresh turn ID, reused if that same delivery has to be retried: a retry after a
// lost response then returns the stored result instead of running the turn again.
//
// A turn is sent streamed (Accept: text/event-stream): its model text shows as it arrives,
// its steps as they finish; only the closing `result` event is what committed. Each turn
// the console ran is kept (per tab, sessionStorage) with its steps, and the conversation
// shows them under that turn's messages, grouped by the round that ran them.
//
// Without ?thread=ID the console opens on the queue: across the token's threads, the
// writes whose outcome is unknown (uncertain, or left prepared) and the confirmations
// waiting for an answer, each linking to its thread.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  threadId: "",
  interaction: null, // the pending one, as the thread view shows it
  busy: false,
  messages: [], // the thread's, as last loaded
  live: null, // the turn streaming now: { turnId, message, text, steps: Map }
};

class ProblemError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function headers(accept = "application/json") {
  const result = { "Content-Type": "application/json", Accept: accept };
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

// The server-sent events of a response: { type, data } with data parsed from JSON. The
// host writes each event as `event:` and one `data:` line, ended by a blank line.
async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        const colon = line.indexOf(":");
        if (colon === 0) continue; // a comment
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") type = text;
        else if (field === "data") data.push(text);
      }
      if (data.length) yield { type, data: JSON.parse(data.join("\n")) };
    }
  }
}

// One attempt at a streamed turn: each event before `result` goes to onEvent, and the
// result is returned. A turn refused before it started answers problem details (JSON);
// one that failed after it started ends with an `error` event (nothing committed).
async function streamTurn(request, onEvent) {
  const response = await fetch(threadPath("/turns"), {
    method: "POST",
    body: JSON.stringify(request),
    headers: headers("text/event-stream"),
  });
  const type = response.headers.get("content-type") || "";
  if (!type.startsWith("text/event-stream")) {
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new ProblemError(response.status, body);
    return body;
  }
  for await (const event of serverSentEvents(response)) {
    if (event.type === "result") return event.data;
    if (event.type === "error") throw new ProblemError(event.data.status || 500, event.data);
    onEvent(event);
  }
  // A lost stream: the turn may still commit; the retry (same turn ID) gets its result.
  throw new Error("the stream ended before the turn's result");
}

// One delivery, one turn ID: retried (same ID) on network errors, lost streams and 503s
// only. What streamed before a retry was provisional, so each attempt starts afresh.
async function postTurn(body) {
  const request = { ...body, turn_id: newTurnId() };
  for (let attempt = 1; ; attempt += 1) {
    state.live = {
      turnId: request.turn_id,
      message: body.message,
      text: "",
      steps: new Map(),
      notes: [],
    };
    $("stop").hidden = false; // the turn runs: the operator may stop it
    $("stop").disabled = false;
    renderConversation();
    try {
      const result = await streamTurn(request, onTurnEvent);
      rememberTurn(result, state.live.notes);
      return result;
    } catch (error) {
      const retryable = !(error instanceof ProblemError) || error.status === 503;
      if (!retryable || attempt >= 3) throw error;
      await sleep(500 * attempt);
    } finally {
      state.live = null;
      $("stop").hidden = true;
    }
  }
}

// The messages waiting in the thread's inbox, in order; each can be removed (DELETE of
// its turn: it is dequeued and never runs).
function renderInbox(waiting) {
  $("inbox").hidden = waiting.length === 0;
  $("inbox-list").replaceChildren(
    ...waiting.map((queued) => {
      const item = el("li", "queued");
      item.dataset.turnId = queued.turn_id;
      item.append(el("span", "who", `${queued.steer ? "steer" : "queued"} · ${queued.turn_id}`));
      item.append(el("span", "text", queued.message || "(an answer)"));
      const remove = el("button", "secondary remove", "Remove");
      remove.type = "button";
      remove.addEventListener("click", () =>
        run(() => api(threadPath(`/turns/${encodeURIComponent(queued.turn_id)}`), { method: "DELETE" })),
      );
      item.append(remove);
      return item;
    }),
  );
}

// What the kernel's own timers do; an application's timer shows its message.
function kernelTimerNote(key) {
  if (key.startsWith("kernel:expire:")) return "expires the pending confirmation";
  if (key.startsWith("kernel:remind:")) return "reminds of the pending confirmation";
  return "";
}

// The thread's pending timers: turns the kernel runs later, earliest first. A key
// beginning with "kernel:" is the kernel's own (a confirmation's expiry or reminder).
function renderTimers(timers) {
  const pending = [...timers].sort((a, b) => Date.parse(a.due_at) - Date.parse(b.due_at));
  $("timers").hidden = pending.length === 0;
  $("timers-list").replaceChildren(
    ...pending.map((timer) => {
      const item = el("li", "timer");
      item.dataset.key = timer.key;
      const due = new Date(timer.due_at).toLocaleString();
      let every = "";
      if (timer.cron) every = ` · cron ${timer.cron}`;
      else if (timer.every_seconds) every = ` · every ${duration(timer.every_seconds)}`;
      item.append(el("span", "who", `${timer.key} · due ${due}${every}`));
      item.append(el("span", "text", timer.message || kernelTimerNote(timer.key)));
      return item;
    }),
  );
}

// Stop: ask the running turn to stop at its next safe point (DELETE, Kernel.cancel).
// Its stream then ends with the committed reply, which says it was cancelled.
async function stopTurn() {
  const live = state.live;
  if (!live) return;
  $("stop").disabled = true;
  const reason = encodeURIComponent("stopped from the console");
  try {
    await api(threadPath(`/turns/${encodeURIComponent(live.turnId)}?reason=${reason}`), {
      method: "DELETE",
    });
  } catch (error) {
    showBanner(describeError(error));
  }
}

function onTurnEvent(event) {
  const live = state.live;
  if (!live) return;
  if (event.type === "delta") live.text += event.data.text;
  // A step reported again (superseded later in the turn) replaces its earlier status.
  else if (event.type === "step") live.steps.set(event.data.step_id, event.data);
  else if (event.type === "interaction") renderInteraction(event.data);
  else if (INBOX_EVENTS.has(event.type)) live.notes.push(inboxNote(event));
  renderConversation();
}

// What the thread's inbox did to the turn as it streamed: one line per event.
const INBOX_EVENTS = new Set(["queued", "steered", "interrupted", "cancelled"]);

function inboxNote({ type, data }) {
  let text;
  if (type === "queued" && data.taken_by) text = `handed to turn ${data.taken_by}`;
  else if (type === "queued") text = `waits in the inbox, place ${data.position}`;
  else if (type === "steered") text = `took ${data.turn_id}'s message before round ${data.round}`;
  else text = data.reply;
  return { type, text };
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

// The turns this tab ran on each thread, by turn ID: { steps, replayed }. The thread
// view keeps messages, not steps, so a turn sent elsewhere shows its messages only.
const KEPT_TURNS = 50;

function turnsKey() {
  return `intention-kernel.turns:${state.threadId}`;
}

function keptTurns() {
  try {
    return JSON.parse(sessionStorage.getItem(turnsKey()) || "{}");
  } catch {
    return {};
  }
}

function rememberTurn(result, notes = []) {
  const turns = keptTurns();
  delete turns[result.turn_id]; // re-inserted last: the oldest are dropped first
  turns[result.turn_id] = { steps: result.steps, replayed: result.replayed, notes };
  const ids = Object.keys(turns);
  for (const id of ids.slice(0, Math.max(0, ids.length - KEPT_TURNS))) delete turns[id];
  sessionStorage.setItem(turnsKey(), JSON.stringify(turns));
}

function messageItem(role, turnId, content) {
  const item = el("li", `message ${role}`);
  item.dataset.turn = turnId;
  item.append(el("span", "who", `${role} · ${turnId}`), el("span", "text", content));
  return item;
}

const MAX_SHOWN_VALUE = 300;

// One step: the capability the round asked for, its status, and its value or error.
function stepItem(step) {
  const item = el("li", "step");
  item.dataset.step = step.step_id;
  item.append(el("code", "", step.capability_id), el("span", `badge ${step.status}`, step.status));
  if (step.actor) item.append(el("span", "actor", `by ${step.actor}`)); // who answered
  if (step.approved_input) {
    item.append(el("span", "muted", `edited: ${compact(step.approved_input)}`));
  }
  if (step.error) {
    item.append(el("span", "outcome error", step.error));
  } else if (step.value !== null && step.value !== undefined) {
    const text = compact(step.value);
    const shown = text.length > MAX_SHOWN_VALUE ? `${text.slice(0, MAX_SHOWN_VALUE)}…` : text;
    item.append(el("span", "outcome muted", shown));
  }
  return item;
}

// A turn's steps grouped by the round that ran them (one step list when it had one round).
function stepsItem(turnId, steps, { replayed = false, live = false, notes = [] } = {}) {
  const item = el("li", live ? "turn-steps live" : "turn-steps");
  item.dataset.turn = turnId;
  if (replayed) item.append(el("span", "badge replayed", "replayed: nothing ran again"));
  for (const note of notes) {
    const line = el("div", `inbox-event ${note.type}`);
    line.append(el("span", `badge ${note.type}`, note.type), el("span", "muted", note.text));
    item.append(line);
  }
  const rounds = new Map();
  for (const step of steps) {
    const round = step.round || 1;
    if (!rounds.has(round)) rounds.set(round, []);
    rounds.get(round).push(step);
  }
  const many = rounds.size > 1;
  for (const [round, roundSteps] of rounds) {
    const group = el("div", "round");
    group.dataset.round = String(round);
    group.append(el("span", "who", many ? `round ${round}` : "steps"));
    const list = el("ul", "steps");
    list.append(...roundSteps.map(stepItem));
    group.append(list);
    item.append(group);
  }
  if (!steps.length) item.append(el("span", "who", live ? "working…" : "no steps"));
  return item;
}

// The thread's messages, each turn's steps before its reply, and the turn streaming now.
function renderConversation() {
  const turns = keptTurns();
  const items = [];
  const shown = new Set();
  const steps = (turnId) => {
    const turn = turns[turnId];
    if (!turn || shown.has(turnId)) return;
    shown.add(turnId);
    items.push(stepsItem(turnId, turn.steps, { replayed: turn.replayed, notes: turn.notes }));
  };
  for (const message of state.messages) {
    if (message.role !== "user") steps(message.turn_id);
    items.push(messageItem(message.role, message.turn_id, message.content));
  }
  const live = state.live;
  if (live) {
    $("empty-thread").hidden = true;
    if (live.message !== undefined) items.push(messageItem("user", live.turnId, live.message));
    items.push(stepsItem(live.turnId, [...live.steps.values()], { live: true, notes: live.notes }));
    if (live.text) {
      const reply = messageItem("assistant", live.turnId, live.text);
      reply.classList.add("streaming");
      items.push(reply);
    }
  }
  const list = $("messages");
  list.replaceChildren(...items);
  list.scrollTop = list.scrollHeight;
}

function renderInteraction(interaction) {
  const same = state.interaction && interaction && state.interaction.id === interaction.id;
  state.interaction = interaction;
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
  renderTimeLeft();
  renderApprovers(interaction);
  renderWhoMayAnswer(interaction);
  // Only a held ("confirmation") operation's input is edited, against its schema. A new
  // interaction starts from its proposed input; the same one keeps what is being typed.
  const editable = interaction.kind === "confirmation" && Boolean(interaction.input_schema);
  $("edit").hidden = !editable;
  if (!same) {
    $("edit").open = false;
    $("edit-input").value = JSON.stringify(interaction.input, null, 2);
    showEditError("");
    $("reject-reason").value = "";
  }
}

// A quorum (approvals above 1): how many distinct approvers it needs and who has approved
// so far. An accept from one of them again, or from no one named, is refused by the kernel.
function renderApprovers(interaction) {
  const quorum = (interaction.approvals || 1) > 1;
  $("confirmation-approvers-label").hidden = !quorum;
  $("confirmation-approvers").hidden = !quorum;
  if (!quorum) return;
  const approvers = interaction.approved_by || [];
  const who = approvers.length ? approvers.join(", ") : "no one yet";
  $("confirmation-approvers").textContent =
    `${approvers.length} of ${interaction.approvals} · approved by ${who}`;
}

// Who may answer, under the capability's approver policy: shown when the policy is not
// the default (anyone who may post to the thread), whose answer the kernel never refuses.
const ANYONE = "anyone who may post to the thread";
function renderWhoMayAnswer(interaction) {
  const who = interaction.who_may_answer;
  const shown = Boolean(who) && who !== ANYONE;
  $("confirmation-who-label").hidden = !shown;
  $("confirmation-who").hidden = !shown;
  const proposer = interaction.proposed_by ? ` · proposed by ${interaction.proposed_by}` : "";
  $("confirmation-who").textContent = shown ? `${who}${proposer}` : "";
}

// "answer by" with the time left, recomputed every second while a deadline is shown.
function renderTimeLeft() {
  const interaction = state.interaction;
  if (!interaction || !interaction.expires_at) return;
  const expires = new Date(interaction.expires_at);
  const left = Math.floor((expires.getTime() - Date.now()) / 1000);
  const status = left > 0 ? `${duration(left)} left` : "overdue: an accept now runs nothing";
  $("confirmation-expires").textContent = `${expires.toLocaleString()} · ${status}`;
}

function duration(seconds) {
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  if (hours) return `${hours} h ${minutes} min`;
  return minutes ? `${minutes} min ${seconds % 60} s` : `${seconds} s`;
}

function showEditError(message) {
  $("edit-error").textContent = message || "";
  $("edit-error").hidden = !message;
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

// A receipt's key, status badge and cause (with its attempt, turn and approver) in a
// list item; causeSelector names the item's element for the cause.
function describeReceipt(item, receipt, causeSelector) {
  item.querySelector(".key").textContent = receipt.key;
  const badge = item.querySelector(".badge");
  badge.textContent = receipt.status;
  badge.className = `badge ${receipt.status}`;
  const approvers = (receipt.approved_by || []).join(", ") || receipt.actor;
  const approver = approvers ? ` · approved by ${approvers}` : "";
  item.querySelector(causeSelector).textContent =
    `${receiptCause(receipt)} · attempt ${receipt.attempt} · turn ${receipt.turn_id}${approver}`;
  // What the write was: its capability and the input that ran (redacted as stored).
  // A receipt stored before receipts recorded it has neither, and shows no line.
  const write = item.querySelector(".write");
  write.hidden = !receipt.capability_id;
  write.textContent = receipt.capability_id
    ? `for ${receipt.capability_id}` +
      (receipt.input === null || receipt.input === undefined
        ? ""
        : ` ${JSON.stringify(receipt.input)}`)
    : "";
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

function setEnabled(enabled) {
  for (const id of ["message", "send", "accept", "reject", "approve-edited"]) {
    $(id).disabled = !enabled;
  }
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
        ((pending.interaction.approvals || 1) > 1
          ? ` · ${(pending.interaction.approved_by || []).length} of ` +
            `${pending.interaction.approvals} approvals`
          : "") +
        (pending.interaction.expires_at
          ? ` · answer by ${new Date(pending.interaction.expires_at).toLocaleString()}`
          : "") +
        (pending.interaction.who_may_answer
          ? ` · who may answer: ${pending.interaction.who_may_answer}`
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
    const [thread, receipts, timers] = await Promise.all([
      api(threadPath()).catch((error) => {
        if (error instanceof ProblemError && error.status === 404) return null;
        throw error;
      }),
      resolvableReceipts(state.threadId),
      api(threadPath("/timers?status=pending&limit=500")).catch((error) => {
        if (error instanceof ProblemError && error.status === 404) return { timers: [] };
        throw error;
      }),
    ]);
    $("empty-thread").hidden = Boolean(thread);
    $("empty-thread").textContent = "No turn on this thread yet: send the first message.";
    $("version").textContent = thread ? `· v${thread.version}` : "";
    state.messages = thread ? thread.messages : [];
    renderConversation();
    renderInteraction(thread ? thread.interaction : null);
    renderInbox(thread ? thread.inbox || [] : []);
    renderTimers(timers.timers);
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

// An answer names the interaction and the digest of the operation shown: if the thread
// moved on to another operation meanwhile, the host runs nothing.
function answer(decision, extra = {}) {
  const shown = state.interaction;
  if (!shown) return undefined;
  return run(async () => {
    await postTurn({
      answer: { interaction_id: shown.id, decision, digest: shown.digest, ...extra },
    });
  });
}

function reject() {
  const reason = $("reject-reason").value.trim();
  return answer("reject", reason ? { reason } : {});
}

// The edited input, checked in the page against the capability's input schema: an edit
// the kernel would refuse is never sent (the kernel checks it again all the same).
function approveEdited() {
  const shown = state.interaction;
  if (!shown) return undefined;
  let input;
  try {
    input = JSON.parse($("edit-input").value);
  } catch {
    showEditError('The input is invalid JSON: write an object, such as {"amount": 300}.');
    return undefined;
  }
  const problems = schemaProblems(shown.input_schema, input, shown.input_schema);
  if (problems.length) {
    showEditError(`Not sent: ${problems.join("; ")}.`);
    return undefined;
  }
  showEditError("");
  return answer("accept", { input });
}

// -- JSON schema: the subset pydantic writes for an input model -----------------------------
// Keywords it does not know are not checked here; the kernel validates every edit anyway.

function jsonType(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value; // string, boolean, object
}

// Bounds, each [keyword, whether a value breaks it, what the page says].
const BOUNDS = [
  ["minimum", (v, b) => v < b, (b) => `must be at least ${b}`],
  ["maximum", (v, b) => v > b, (b) => `must be at most ${b}`],
  ["exclusiveMinimum", (v, b) => v <= b, (b) => `must be more than ${b}`],
  ["exclusiveMaximum", (v, b) => v >= b, (b) => `must be less than ${b}`],
  ["multipleOf", (v, b) => !Number.isInteger(v / b), (b) => `must be a multiple of ${b}`],
];
const LENGTHS = [
  ["minLength", (n, b) => n < b, (b) => `must have at least ${b} characters`],
  ["maxLength", (n, b) => n > b, (b) => `must have at most ${b} characters`],
  ["minItems", (n, b) => n < b, (b) => `must have at least ${b} items`],
  ["maxItems", (n, b) => n > b, (b) => `must have at most ${b} items`],
];

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// What is wrong with `value` under `schema` (root: where `$ref`s point), one line each.
function schemaProblems(schema, value, root, where = "input") {
  if (schema === true || schema === undefined || schema === null) return [];
  if (schema === false) return [`${where}: not allowed`];
  if (schema.$ref) {
    const path = schema.$ref.replace(/^#\//, "").split("/");
    const target = path.reduce((node, part) => node && node[part], root);
    return target ? schemaProblems(target, value, root, where) : [];
  }
  const problems = [];
  const fail = (message) => problems.push(`${where}: ${message}`);
  const type = jsonType(value);
  if (schema.type !== undefined) {
    const allowed = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!allowed.includes(type) && !(type === "integer" && allowed.includes("number"))) {
      const wrong = [`${where}: must be ${allowed.join(" or ")}, not ${type}`];
      wrong.wrongType = true; // for anyOf: this form is not the one meant
      return wrong;
    }
  }
  if (schema.const !== undefined && !same(schema.const, value)) {
    fail(`must be ${JSON.stringify(schema.const)}`);
  }
  if (schema.enum && !schema.enum.some((option) => same(option, value))) {
    fail(`must be one of ${schema.enum.map((option) => JSON.stringify(option)).join(", ")}`);
  }
  if (typeof value === "number") {
    for (const [keyword, fails, says] of BOUNDS) {
      const bound = schema[keyword];
      if (bound !== undefined && fails(value, bound)) fail(says(bound));
    }
  }
  // Strings count code points, as JSON schema does; arrays count items.
  let length = null;
  if (typeof value === "string") length = [...value].length;
  else if (type === "array") length = value.length;
  if (length !== null) {
    for (const [keyword, fails, says] of LENGTHS) {
      const bound = schema[keyword];
      if (bound !== undefined && fails(length, bound)) fail(says(bound));
    }
  }
  if (typeof value === "string" && schema.pattern !== undefined) {
    let pattern = null;
    try {
      pattern = new RegExp(schema.pattern, "u");
    } catch {
      // A pattern JavaScript cannot read is left to the kernel.
    }
    if (pattern && !pattern.test(value)) fail(`must match ${schema.pattern}`);
  }
  if (type === "array" && schema.items && typeof schema.items === "object") {
    value.forEach((item, index) => {
      problems.push(...schemaProblems(schema.items, item, root, `${where}[${index}]`));
    });
  }
  if (type === "object") {
    const properties = schema.properties || {};
    const at = (name) => (where === "input" ? name : `${where}.${name}`);
    for (const name of schema.required || []) {
      if (!(name in value)) problems.push(`${at(name)}: required`);
    }
    for (const [name, item] of Object.entries(value)) {
      const extra = schema.additionalProperties;
      if (name in properties) {
        problems.push(...schemaProblems(properties[name], item, root, at(name)));
      } else if (extra === false) {
        problems.push(`${at(name)}: not an input of this capability`);
      } else if (typeof extra === "object") {
        problems.push(...schemaProblems(extra, item, root, at(name)));
      }
    }
  }
  for (const part of schema.allOf || []) problems.push(...schemaProblems(part, value, root, where));
  const verdicts = (options) => options.map((option) => schemaProblems(option, value, root, where));
  if (schema.anyOf) {
    const each = verdicts(schema.anyOf);
    if (!each.some((found) => found.length === 0)) {
      // One form of the value's type (a string, for `str | None`): its problems say most.
      const typed = each.filter((found) => !found.wrongType);
      if (typed.length === 1) problems.push(...typed[0]);
      else fail("fits none of the allowed forms");
    }
  }
  if (schema.oneOf && verdicts(schema.oneOf).filter((found) => found.length === 0).length !== 1) {
    fail("must fit exactly one allowed form");
  }
  return problems;
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
  $("reject").addEventListener("click", () => reject());
  $("approve-edited").addEventListener("click", () => approveEdited());
  $("stop").addEventListener("click", () => stopTurn());
  setInterval(renderTimeLeft, 1000);
  $("send-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = $("message").value.trim();
    if (!message) return;
    run(async () => {
      $("message").value = ""; // shown in the conversation while the turn streams
      try {
        await postTurn({ message });
      } catch (error) {
        $("message").value = message; // not sent after all: the operator keeps it
        throw error;
      }
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
