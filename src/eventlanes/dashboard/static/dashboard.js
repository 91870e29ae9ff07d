// Refresh the body every few seconds; buttons POST JSON to the API after a confirmation.
"use strict";
const body = document.getElementById("body");
const message = document.getElementById("message");
const refreshMs = Number(document.body.dataset.refreshMs) || 2000;

async function refresh() {
  try {
    const response = await fetch("fragment", { cache: "no-store" });
    if (response.ok) body.innerHTML = await response.text();
  } catch (err) {
    message.textContent = "dashboard unreachable: " + err;
    message.className = "error";
  }
}

async function act(button) {
  let payload = JSON.parse(button.dataset.body || "{}");
  if (button.dataset.prompt) {
    const to = window.prompt(button.dataset.prompt, button.dataset.default || "");
    if (to === null) return;
    payload.to = to;
  } else if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) {
    return;
  }
  button.disabled = true;
  message.textContent = button.textContent + "...";
  message.className = "";
  try {
    const response = await fetch(button.dataset.url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(payload),
    });
    const answer = await response.json();
    message.textContent = response.ok ? answer.message : "error: " + answer.error;
    message.className = response.ok ? "ok" : "error";
  } catch (err) {
    message.textContent = "error: " + err;
    message.className = "error";
  }
  await refresh();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-url]");
  if (button) act(button);
});
setInterval(refresh, refreshMs);
