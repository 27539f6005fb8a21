// The play page: a person plays one episode through the env, a form per tool, then the reward.
import { api, clear, el, fill, folded, pretty, renderItems, rewardBadge, verifyBlock } from "/static/common.js";

const main = document.getElementById("main");
let info = null;
let current = null; // the session of the episode on the page

// An episode left for another is closed on the server now rather than when it is evicted.
function leave() {
  if (current) api(`/api/sessions/${encodeURIComponent(current)}`, { method: "DELETE" }).catch(() => {});
  current = null;
}

function errorBox(id) {
  return el("div", { class: "error-box hidden", id });
}

function showError(box, error) {
  box.textContent = String(error && error.message ? error.message : error);
  box.classList.remove("hidden");
}

// ---- choosing a task ----------------------------------------------------------------------------

function renderStart() {
  leave();
  const select = el("select", { id: "task-select" },
    info.tasks.map((task) => el("option", { value: String(task.index) }, `${task.index}: ${task.preview}`)));
  const problem = errorBox("start-error");
  const button = el("button", { type: "submit", id: "start" }, "Start episode");
  const form = el("form", { class: "start" }, el("label", {}, "Task ", select), button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    button.disabled = true;
    try {
      renderEpisode(await api("/api/sessions", { method: "POST", body: { task_index: Number(select.value) } }));
    } catch (error) {
      showError(problem, error);
      button.disabled = false;
    }
  });
  fill(main, 
    el("h1", {}, `Play ${info.server}`),
    el("p", { class: "muted" }, `${info.num_tasks} task(s). You play the model: call the tools, then give a final answer; the server's verifier scores it. Saved episodes go to ${info.output}.`),
    form, problem);
}

// ---- a form per tool, from its JSON schema -------------------------------------------------------

function schemaType(schema) {
  const type = schema && schema.type;
  if (Array.isArray(type)) return type.find((t) => t !== "null") || "string";
  return type || (schema && schema.enum ? "enum" : "json");
}

function exampleOf(schema) {
  const type = schemaType(schema);
  if (type === "array") return JSON.stringify([exampleOf(schema.items || {})]);
  if (type === "object") return "{}";
  if (type === "integer" || type === "number") return 1;
  if (type === "boolean") return true;
  return "text";
}

// One input for one property; read() gives {value} (absent: {}) or throws with a message.
function field(name, schema, required) {
  const type = schemaType(schema);
  const id = `arg-${name}`;
  let input;
  let read;
  if (Array.isArray(schema.enum)) {
    input = el("select", { id, name },
      required ? null : el("option", { value: "" }, "(leave out)"),
      schema.enum.map((value, i) => el("option", { value: String(i) }, typeof value === "string" ? value : JSON.stringify(value))));
    read = () => (input.value === "" ? {} : { value: schema.enum[Number(input.value)] });
  } else if (type === "boolean") {
    input = el("input", { id, name, type: "checkbox" });
    read = () => ({ value: input.checked });
  } else if (type === "integer" || type === "number") {
    input = el("input", { id, name, type: "number", step: type === "integer" ? "1" : "any" });
    read = () => {
      if (input.value.trim() === "") return {};
      const value = Number(input.value);
      if (!Number.isFinite(value) || (type === "integer" && !Number.isInteger(value))) throw new Error(`${name}: not an ${type}`);
      return { value };
    };
  } else if (type === "string") {
    input = el("textarea", { id, name, rows: 1 });
    read = () => (input.value === "" && !required ? {} : { value: input.value });
  } else {
    input = el("textarea", { id, name, rows: 2, class: "json", placeholder: `JSON, e.g. ${exampleOf(schema)}` });
    read = () => {
      if (input.value.trim() === "") return {};
      try {
        return { value: JSON.parse(input.value) };
      } catch (error) {
        throw new Error(`${name}: not valid JSON (${error.message})`);
      }
    };
  }
  const label = el("label", { for: id, class: "arg-name" }, name, required ? el("span", { class: "required", title: "required" }, " *") : null,
    el("span", { class: "arg-type" }, ` ${Array.isArray(schema.enum) ? "one of" : type}`));
  const row = el("div", { class: "arg" }, label, input, schema.description ? el("div", { class: "muted" }, String(schema.description)) : null);
  return { name, row, read };
}

function toolForm(tool, onCall) {
  const params = tool && tool.parameters && typeof tool.parameters === "object" ? tool.parameters : {};
  const properties = params.properties && typeof params.properties === "object" ? params.properties : {};
  const required = new Set(Array.isArray(params.required) ? params.required : []);
  const fields = Object.entries(properties).map(([name, schema]) => field(name, schema || {}, required.has(name)));
  const rawToggle = el("input", { type: "checkbox", class: "raw-toggle" });
  const raw = el("textarea", { class: "json raw hidden", rows: 4, placeholder: "the arguments as JSON (sent as typed, even if it is not JSON)" });
  const problem = el("div", { class: "error-box hidden" });
  const button = el("button", { type: "submit", class: "call-button" }, `Call ${tool.name}`);
  const form = el("form", { class: "tool-form", id: `tool-${tool.name}`, dataset: { tool: tool.name } },
    el("div", { class: "tool-title" }, el("code", { class: "tool-name" }, String(tool.name))),
    tool.description ? el("div", { class: "muted" }, String(tool.description)) : null,
    el("div", { class: "fields" }, fields.map((f) => f.row)),
    el("label", { class: "raw-label" }, rawToggle, " edit the arguments as JSON"), raw, problem, button);

  const formArguments = () => {
    const args = {};
    for (const f of fields) {
      const got = f.read();
      if ("value" in got) args[f.name] = got.value;
      else if (required.has(f.name)) throw new Error(`${f.name} is required`);
    }
    return args;
  };
  rawToggle.addEventListener("change", () => {
    if (rawToggle.checked) {
      try {
        raw.value = JSON.stringify(formArguments(), null, 2);
      } catch (error) {
        raw.value = "{}";
      }
    }
    raw.classList.toggle("hidden", !rawToggle.checked);
    for (const f of fields) f.row.classList.toggle("hidden", rawToggle.checked);
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.classList.add("hidden");
    let args;
    try {
      args = rawToggle.checked ? raw.value : formArguments();
    } catch (error) {
      showError(problem, error);
      return;
    }
    button.disabled = true;
    try {
      await onCall(tool.name, args);
    } catch (error) {
      showError(problem, error);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

// ---- the episode ------------------------------------------------------------------------------------

function renderEpisode(episode) {
  current = episode.session;
  const transcript = el("div", { id: "transcript", class: "transcript" });
  const result = el("div", { id: "result" });
  const turnNote = el("span", { class: "muted", id: "turn-note" }, `turn 1 of at most ${episode.max_steps}`);
  const problem = errorBox("turn-error");
  const answer = el("textarea", { id: "final-answer", rows: 3, placeholder: "the final answer (a turn without tool calls ends the episode)" });
  const answerButton = el("button", { type: "submit", id: "submit-answer" }, "Submit final answer");
  const answerForm = el("form", { class: "answer-form" }, el("label", { for: "final-answer", class: "arg-name" }, "Final answer"), answer, answerButton);
  const actions = el("section", { id: "actions", class: "actions" });

  const play = async (body) => {
    problem.classList.add("hidden");
    const reply = await api(`/api/sessions/${encodeURIComponent(episode.session)}/step`, { method: "POST", body });
    transcript.appendChild(renderItems([...reply.items, ...reply.observation]));
    turnNote.textContent = `turn ${reply.turn + 1} of at most ${episode.max_steps}`;
    if (reply.info && reply.info.error) transcript.appendChild(el("div", { class: "error-box" }, String(reply.info.error)));
    if (reply.terminated || reply.truncated) finish(reply);
    return reply;
  };

  const finish = (reply) => {
    actions.classList.add("hidden");
    const saveButton = el("button", { type: "button", id: "save" }, "Save as rollout row");
    const saved = el("div", { id: "saved", class: "muted" });
    saveButton.addEventListener("click", async () => {
      saveButton.disabled = true;
      try {
        const where = await api(`/api/sessions/${encodeURIComponent(episode.session)}/save`, { method: "POST", body: {} });
        saved.textContent = `saved to ${where.path} as task ${where.task_index}, rollout ${where.rollout_index}`;
      } catch (error) {
        saved.textContent = String(error.message || error);
        saveButton.disabled = false;
      }
    });
    fill(result, 
      el("h2", {}, reply.truncated ? "Episode over (step limit or server error: truncated)" : "Episode over"),
      reply.verify ? verifyBlock(reply.verify) : el("div", { class: "final-reward" }, "reward ", rewardBadge(reply.reward, "big")),
      reply.verify ? el("div", { class: "save" }, saveButton, saved) : null,
      el("button", { type: "button", id: "new-episode", onclick: renderStart }, "New episode"));
  };

  answerForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    answerButton.disabled = true;
    try {
      await play({ message: answer.value });
    } catch (error) {
      showError(problem, error);
      answerButton.disabled = false;
    }
  });

  const tools = Array.isArray(episode.tools) ? episode.tools : [];
  fill(actions,
    el("h2", {}, "Your turn ", turnNote),
    tools.length ? el("div", { class: "tool-forms" }, tools.map((tool) => toolForm(tool, (name, args) => play({ calls: [{ name, arguments: args }] })))) : el("p", { class: "muted" }, "This task has no tools."),
    answerForm, problem);
  fill(main, 
    el("div", { class: "crumbs" }, el("button", { type: "button", onclick: renderStart }, "← tasks")),
    el("h1", { id: "episode-title" }, `Task ${episode.task_index} · ${episode.server}`),
    el("h2", {}, "The task"),
    renderItems(episode.observation),
    Object.keys(episode.sampling || {}).length ? el("details", {}, el("summary", {}, "sampling parameters"), folded(pretty(episode.sampling), "json")) : null,
    el("h2", {}, "Episode"), transcript, result, actions);
}

(async () => {
  try {
    info = await api("/api/info");
    document.getElementById("server-name").textContent = info.server;
    renderStart();
  } catch (error) {
    clear(main).appendChild(el("div", { class: "error-box" }, String(error.message || error)));
  }
})();
