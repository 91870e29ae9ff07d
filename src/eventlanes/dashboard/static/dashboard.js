// The dashboard's few lines of script: refresh the body, count retries down, and run actions
// through a dialog (never window.prompt or confirm). Every URL is relative to the page, so it
// works behind a reverse proxy under a path prefix. The operator token stays in this tab's
// sessionStorage and travels only in the Authorization header of actions.
"use strict";

const body = document.getElementById("body");
const message = document.getElementById("message");
const refreshMs = Number(document.body.dataset.refreshMs) || 2000;
const TOKEN = "eventlanes-dashboard-token";

const dialog = document.getElementById("action-dialog");
const form = document.getElementById("action-form");
const title = document.getElementById("action-title");
const text = document.getElementById("action-text");
const fields = document.getElementById("action-fields");
const planBox = document.getElementById("action-plan");
const tokenField = document.getElementById("token-field");
const tokenInput = document.getElementById("action-token");
const errorBox = document.getElementById("action-error");
const confirmButton = document.getElementById("action-confirm");
const cancelButton = document.getElementById("action-cancel");
const forget = document.getElementById("forget-token");

let loadedAt = Date.now();
let current = null; // the action the dialog is for: {what, name, body, plan, planned}

function token() {
  return sessionStorage.getItem(TOKEN) || "";
}

function showForget() {
  if (forget) forget.hidden = !token();
}

function say(text, kind) {
  message.textContent = text;
  message.className = kind || "";
}

async function refresh() {
  try {
    const response = await fetch("fragment", { cache: "no-store" });
    if (response.ok) {
      body.innerHTML = await response.text();
      loadedAt = Date.now();
      tick();
    }
  } catch (err) {
    say("dashboard unreachable: " + err, "error");
  }
}

// The retry countdowns of failing segments and partitions, every second between refreshes.
function tick() {
  const gone = (Date.now() - loadedAt) / 1000;
  for (const el of body.querySelectorAll(".countdown")) {
    const left = Math.round(Number(el.dataset.seconds) - gone);
    el.textContent = left > 0 ? "retry in " + left + " s" : "retry due";
  }
}

function url(name, what) {
  return "api/processors/" + encodeURIComponent(name) + "/" + what;
}

async function post(name, what, payload) {
  const headers = { "content-type": "application/json" };
  const t = token();
  if (t) headers.authorization = "Bearer " + t;
  const response = await fetch(url(name, what), {
    method: "POST",
    headers,
    body: JSON.stringify(payload),
  });
  let answer = {};
  try {
    answer = await response.json();
  } catch (err) {
    answer = { error: "HTTP " + response.status };
  }
  return { status: response.status, ok: response.ok, answer };
}

function field(label, input) {
  const wrap = document.createElement("label");
  wrap.className = "field";
  wrap.append(label, input);
  fields.append(wrap);
  return input;
}

function open(button) {
  const data = button.dataset;
  current = {
    what: data.action,
    name: data.name,
    body: JSON.parse(data.body || "{}"),
    plan: data.plan || null,
    planned: false,
  };
  title.textContent = data.title;
  text.textContent = data.text || "";
  fields.replaceChildren();
  planBox.hidden = true;
  planBox.replaceChildren();
  errorBox.textContent = "";
  confirmButton.className = button.classList.contains("danger") ? "primary danger" : "primary";
  if (data.options) {
    const select = document.createElement("select");
    select.id = "action-segment";
    for (const option of JSON.parse(data.options)) {
      const o = document.createElement("option");
      o.value = option.id;
      o.textContent = option.label;
      select.append(o);
    }
    field("Segment ", select);
  }
  const wanted = (data.fields || "").split(",");
  if (wanted.includes("to")) {
    const to = document.createElement("input");
    to.id = "action-to";
    to.value = "tail";
    to.placeholder = "tail, head, a position or an ISO time";
    to.addEventListener("input", unplan);
    field("Replay from ", to);
  }
  if (wanted.includes("keep_tables")) {
    const keep = document.createElement("input");
    keep.type = "checkbox";
    keep.id = "action-keep-tables";
    keep.addEventListener("change", unplan);
    field(keep, " keep its tables (for their owner to drop)");
  }
  tokenInput.value = "";
  tokenField.hidden = Boolean(token());
  unplan();
  dialog.showModal();
  (tokenField.hidden ? confirmButton : tokenInput).focus();
}

// Inputs changed (or the dialog opened): a plan must be shown again before confirming.
function unplan() {
  if (!current) return;
  current.planned = false;
  planBox.hidden = true;
  confirmButton.disabled = false;
  confirmButton.textContent = current.plan ? "Show what it does" : verb(current.what);
}

function verb(what) {
  return what.charAt(0).toUpperCase() + what.slice(1);
}

function payload() {
  const out = Object.assign({}, current.body);
  const segment = document.getElementById("action-segment");
  if (segment) out.segment = Number(segment.value);
  const to = document.getElementById("action-to");
  if (to) out.to = to.value.trim();
  const keep = document.getElementById("action-keep-tables");
  if (keep) out.keep_tables = keep.checked;
  const tick = document.getElementById("action-confirm-warnings");
  if (tick) out.confirm = tick.checked;
  return out;
}

function showPlan(answer) {
  planBox.replaceChildren();
  for (const line of answer.lines || []) {
    const p = document.createElement("p");
    p.textContent = line;
    planBox.append(p);
  }
  for (const warning of answer.warnings || []) {
    const p = document.createElement("p");
    p.className = "note";
    p.textContent = "warning: " + warning;
    planBox.append(p);
  }
  if (answer.refused) {
    const p = document.createElement("p");
    p.className = "error";
    p.textContent = answer.refused;
    planBox.append(p);
  } else if (answer.confirm) {
    // The plan warns: as the CLI asks for --yes, the action waits for an explicit tick.
    const label = document.createElement("label");
    const tick = document.createElement("input");
    tick.type = "checkbox";
    tick.id = "action-confirm-warnings";
    tick.addEventListener("change", () => {
      confirmButton.disabled = !tick.checked;
    });
    label.append(tick, " " + verb(current.what) + " anyway, despite the warnings above");
    planBox.append(label);
  }
  planBox.hidden = false;
}

async function submit(event) {
  event.preventDefault();
  if (!current) return;
  if (!tokenField.hidden) {
    const given = tokenInput.value.trim();
    if (!given) {
      errorBox.textContent = "enter the operator token";
      tokenInput.focus();
      return;
    }
    sessionStorage.setItem(TOKEN, given);
    showForget();
  }
  errorBox.textContent = "";
  confirmButton.disabled = true;
  const what = current.plan && !current.planned ? current.plan : current.what;
  let result;
  try {
    result = await post(current.name, what, payload());
  } catch (err) {
    errorBox.textContent = "error: " + err;
    confirmButton.disabled = false;
    return;
  }
  if (result.status === 401) {
    sessionStorage.removeItem(TOKEN);
    showForget();
    tokenField.hidden = false;
    tokenInput.value = "";
    tokenInput.focus();
  }
  if (!result.ok) {
    errorBox.textContent = result.answer.error || "HTTP " + result.status;
    confirmButton.disabled = false;
    return;
  }
  if (what === current.plan) {
    showPlan(result.answer);
    current.planned = true;
    confirmButton.textContent = verb(current.what);
    confirmButton.disabled = Boolean(result.answer.refused || result.answer.confirm);
    return;
  }
  dialog.close();
  say(result.answer.message, "ok");
  await refresh();
}

form.addEventListener("submit", submit);
cancelButton.addEventListener("click", () => dialog.close());
dialog.addEventListener("close", () => {
  current = null;
});
if (forget) {
  forget.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN);
    showForget();
    say("token forgotten", "");
  });
}
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (button) open(button);
});
showForget();
setInterval(refresh, refreshMs);
setInterval(tick, 1000);
