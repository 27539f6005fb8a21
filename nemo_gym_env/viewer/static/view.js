// The rollout viewer: list -> rollout -> group, the summary and the errors, following growing files.
import {
  api, clear, el, fill, fmtCount, fmtReward, folded, inputItems, kvTable, outputItems, pretty, renderItems, rewardBadge,
  toolsBlock, verifyBlock, verifyFields,
} from "/static/common.js";

const main = document.getElementById("main");
const live = document.getElementById("live");
const PAGE_SIZE = 50;
const POLL_MS = 1500;

let lastListHash = "#/list";
let status = null; // the last /api/status
let refreshCurrent = null; // re-reads the data of the page shown, when the files grow

function route() {
  const hash = location.hash || "#/list";
  const [path, query] = hash.slice(1).split("?");
  return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(query || "") };
}

function link(hash, ...children) {
  return el("a", { href: hash }, ...children);
}

function showError(error) {
  clear(main).appendChild(el("div", { class: "error-box" }, String(error && error.message ? error.message : error)));
}

async function render() {
  const { parts, params } = route();
  refreshCurrent = null;
  for (const id of ["nav-list", "nav-summary", "nav-errors"]) document.getElementById(id).classList.remove("active");
  try {
    if (parts[0] === "rollout" && parts.length === 3) await renderRollout(Number(parts[1]), Number(parts[2]));
    else if (parts[0] === "group" && parts.length === 3) await renderGroup(Number(parts[1]), Number(parts[2]), params.get("server") || "");
    else if (parts[0] === "summary") await renderSummary();
    else if (parts[0] === "errors") await renderErrors();
    else await renderList(params);
  } catch (error) {
    showError(error);
  }
}

// ---- the list -------------------------------------------------------------------------------

const COLUMNS = [
  ["line", "line"], ["server", "server"], ["task", "task"], ["rollout", "rollout"], ["reward", "reward"],
  ["turns", "turns"], ["tool_calls", "tool calls"], ["tokens", "tokens"], ["failure", "failure reason"],
];

function listHash(params) {
  const kept = new URLSearchParams();
  for (const [key, value] of params) if (value !== "" && value !== null) kept.set(key, value);
  const text = kept.toString();
  return text ? `#/list?${text}` : "#/list";
}

async function renderList(params) {
  document.getElementById("nav-list").classList.add("active");
  lastListHash = listHash(params);
  const server = params.get("server") || "";
  const outcome = params.get("outcome") || "all";
  const page = Math.max(0, Number(params.get("page") || 0) | 0);

  const go = (changes) => {
    const next = new URLSearchParams(params);
    for (const [key, value] of Object.entries(changes)) next.set(key, value);
    if (!("page" in changes)) next.delete("page");
    location.hash = listHash(next);
  };

  const serverSelect = el("select", { id: "filter-server", name: "server" }, el("option", { value: "" }, "all servers"));
  const outcomeSelect = el("select", { id: "filter-outcome", name: "outcome" },
    ["all", "passed", "failed"].map((value) => el("option", { value, selected: value === outcome }, value === "passed" ? "passed (reward > 0)" : value === "failed" ? "failed (reward ≤ 0, or no reward)" : "passed and failed")));
  const minInput = el("input", { id: "filter-min", type: "number", step: "any", placeholder: "min reward", value: params.get("min_reward") || "" });
  const maxInput = el("input", { id: "filter-max", type: "number", step: "any", placeholder: "max reward", value: params.get("max_reward") || "" });
  const textInput = el("input", { id: "filter-text", type: "search", placeholder: "text in the rollout", value: params.get("q") || "", maxlength: 500 });
  const form = el("form", { class: "filters", id: "filters" },
    serverSelect, outcomeSelect, minInput, maxInput, textInput,
    el("button", { type: "submit" }, "Filter"),
    el("button", { type: "button", onclick: () => { location.hash = "#/list"; } }, "Clear"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go({ server: serverSelect.value, outcome: outcomeSelect.value === "all" ? "" : outcomeSelect.value,
      min_reward: minInput.value, max_reward: maxInput.value, q: textInput.value.trim() });
  });
  outcomeSelect.addEventListener("change", () => form.requestSubmit());
  serverSelect.addEventListener("change", () => form.requestSubmit());

  const notice = el("div", { id: "list-notice" });
  const counts = el("div", { class: "counts", id: "list-counts" });
  const tableBox = el("div", { class: "table-box" });
  const pager = el("div", { class: "pager" });
  fill(main, el("h1", {}, "Rollouts"), notice, form, counts, tableBox, pager);

  const sort = params.get("sort") || "line";
  const order = params.get("order") || "asc";
  const query = new URLSearchParams();
  for (const key of ["server", "min_reward", "max_reward", "q"]) if (params.get(key)) query.set(key, params.get(key));
  if (outcome !== "all") query.set("outcome", outcome);
  query.set("sort", sort);
  query.set("order", order);
  query.set("offset", String(page * PAGE_SIZE));
  query.set("limit", String(PAGE_SIZE));

  const load = async () => {
    const data = await api(`/api/rollouts?${query}`);
    if (serverSelect.options.length !== data.servers.length + 1) {
      clear(serverSelect).appendChild(el("option", { value: "" }, "all servers"));
      for (const name of data.servers) serverSelect.appendChild(el("option", { value: name, selected: name === server }, name || "(no agent_ref)"));
    }
    const first = data.matched ? data.offset + 1 : 0;
    const last = Math.min(data.offset + data.limit, data.matched);
    counts.textContent = `rows ${fmtCount(first)}–${fmtCount(last)} of ${fmtCount(data.matched)} matching (${fmtCount(data.total)} in all)` +
      (data.complete ? "" : " · still indexing…");
    clear(notice);
    if (status && status.errorCount) {
      notice.appendChild(el("div", { class: "warn-box" }, `${fmtCount(status.errorCount)} line(s) are not rollout rows: `, link("#/errors", "see which")));
    }
    const multiFile = status && status.files.filter((f) => f.kind === "rollouts").length > 1;
    const header = el("tr", {}, (multiFile ? [["file", "file"], ...COLUMNS] : COLUMNS).map(([key, label]) => {
      const active = sort === key || (key === "file" && sort === "file");
      const arrow = active ? (order === "desc" ? " ▼" : " ▲") : "";
      return el("th", { class: `sortable ${active ? "sorted" : ""}`, dataset: { column: key }, title: `sort by ${label}`,
        onclick: () => go({ sort: key, order: active && order === "asc" ? "desc" : "asc" }) }, label + arrow);
    }));
    const body = el("tbody", {}, data.rows.map((row) => {
      const hash = `#/rollout/${row.file}/${row.number}`;
      const outcomeClass = row.kind === "failures" ? "failed-rollout" : (typeof row.reward === "number" && row.reward > 0 ? "passed" : "failed");
      const cells = [
        el("td", { class: "num", title: `${filePath(row.file)}:${row.line}` },
          link(hash, row.kind === "failures" ? `failures:${row.line}` : String(row.line))),
        el("td", {}, row.server || ""),
        el("td", { class: "num" }, row.task === null ? "" : String(row.task)),
        el("td", { class: "num" }, row.rollout === null ? "" : String(row.rollout)),
        el("td", { class: "num" }, row.kind === "failures" ? el("span", { class: "tag" }, "failed") : rewardBadge(row.reward)),
        el("td", { class: "num" }, fmtCount(row.turns)),
        el("td", { class: "num" }, fmtCount(row.tool_calls)),
        el("td", { class: "num" }, fmtCount(row.tokens)),
        el("td", { class: "failure-cell", title: row.failure || "" }, row.failure || ""),
      ];
      if (multiFile) cells.unshift(el("td", { class: "file-cell", title: filePath(row.file) }, shortPath(row.file)));
      return el("tr", { class: `row ${outcomeClass}`, dataset: { file: row.file, number: row.number },
        onclick: (event) => { if (event.target.tagName !== "A") location.hash = hash; } }, cells);
    }));
    clear(tableBox).appendChild(el("table", { class: "list", id: "rollout-list" }, el("thead", {}, header), body));
    if (!data.rows.length) tableBox.appendChild(el("p", { class: "muted" }, data.total ? "No rollout matches these filters." : "No rollouts yet: the file is empty or not there (it is followed: rows appear as they are written)."));
    const pages = Math.max(1, Math.ceil(data.matched / PAGE_SIZE));
    fill(pager, 
      el("button", { type: "button", id: "prev-page", disabled: page === 0, onclick: () => go({ page: String(page - 1) }) }, "← previous"),
      el("span", {}, ` page ${page + 1} of ${pages} `),
      el("button", { type: "button", id: "next-page", disabled: page + 1 >= pages, onclick: () => go({ page: String(page + 1) }) }, "next →"));
  };
  await load();
  refreshCurrent = load;
}

function filePath(id) {
  const file = status && status.files.find((f) => f.id === id);
  return file ? file.path : String(id);
}

function shortPath(id) {
  const path = filePath(id);
  return path.length > 40 ? "…" + path.slice(-39) : path;
}

// ---- one rollout ----------------------------------------------------------------------------

function statsLine(data) {
  const parts = [`${data.path}:${data.line}`];
  if (data.turns !== null) parts.push(`${fmtCount(data.turns)} turn(s)`);
  if (data.tool_calls !== null) parts.push(`${fmtCount(data.tool_calls)} tool call(s)`);
  if (data.tokens !== null) parts.push(`${fmtCount(data.tokens)} tokens`);
  return el("div", { class: "meta" }, parts.join(" · "));
}

function title(data) {
  const bits = [data.server || "(no agent_ref)"];
  if (data.task !== null) bits.push(`task ${data.task}`);
  if (data.rollout !== null) bits.push(`rollout ${data.rollout}`);
  return bits.join(" · ");
}

async function renderRollout(file, number) {
  const data = await api(`/api/rollouts/${file}/${number}`);
  const row = data.row;
  const groupLink = data.group
    ? link(`#/group/${data.group.file}/${data.group.task}?server=${encodeURIComponent(data.group.server)}`, `All rollouts of task ${data.group.task} →`)
    : null;
  const usage = row.response && row.response.usage && typeof row.response.usage === "object" ? row.response.usage : null;
  fill(main, 
    el("div", { class: "crumbs" }, link(lastListHash, "← rollouts"), groupLink ? [" · ", groupLink] : null),
    el("h1", { id: "rollout-title" }, data.kind === "failures" ? "Failed rollout: " : "", title(data)),
    statsLine(data),
    data.kind === "failures"
      ? el("section", { class: "verify" }, el("div", { class: "verdict" }, el("span", { class: "tag" }, "failed"),
          el("span", { class: "failure" }, data.failure || "(no reason given)")), kvTable(verifyFields(row)))
      : verifyBlock(row),
    usage ? el("details", { class: "usage" }, el("summary", {}, "usage"), kvTable(usage)) : null,
    data.kind === "failures" ? null : [
      el("h2", {}, "Conversation"),
      toolsBlock(row.responses_create_params && row.responses_create_params.tools),
      renderItems([...inputItems(row), ...outputItems(row)])],
    el("details", { class: "raw" }, el("summary", {}, "the whole row (JSON)"), folded(pretty(row), "json")),
  );
  window.scrollTo(0, 0);
}

// ---- a group: one task's rollouts side by side ------------------------------------------------

async function renderGroup(file, task, server) {
  const data = await api(`/api/group/${file}/${task}?server=${encodeURIComponent(server)}`);
  const rows = data.rows.filter((entry) => entry.row);
  const rewards = rows.map((entry) => entry.reward).filter((value) => typeof value === "number");
  const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
  // Verify fields whose values differ between the rollouts: what the good one did that the bad one did not.
  const keys = new Set(rows.flatMap((entry) => Object.keys(verifyFields(entry.row))));
  const differs = new Set([...keys].filter((key) => new Set(rows.map((entry) => JSON.stringify(entry.row[key]))).size > 1));
  const first = rows[0] ? rows[0].row : null;
  const columns = data.rows.map((entry) => {
    if (!entry.row) return el("div", { class: "group-col" }, el("div", { class: "error-box" }, entry.error || "unreadable"));
    const hash = `#/rollout/${entry.file}/${entry.number}`;
    return el("div", { class: `group-col ${entry.kind === "failures" ? "failed-rollout" : (entry.reward > 0 ? "passed" : "failed")}` },
      el("div", { class: "group-head" },
        link(hash, entry.kind === "failures" ? "failed rollout " : "rollout ", entry.rollout === null ? "?" : String(entry.rollout)),
        entry.kind === "failures" ? el("span", { class: "tag" }, "failed") : rewardBadge(entry.reward, "big")),
      el("div", { class: "meta" }, [
        entry.turns !== null ? `${entry.turns} turn(s)` : null, entry.tool_calls !== null ? `${entry.tool_calls} call(s)` : null,
        entry.tokens !== null ? `${fmtCount(entry.tokens)} tokens` : null].filter(Boolean).join(" · ")),
      groupFields(verifyFields(entry.row), differs),
      renderItems(outputItems(entry.row)));
  });
  fill(main, 
    el("div", { class: "crumbs" }, link(lastListHash, "← rollouts")),
    el("h1", { id: "group-title" }, `Task ${task} · ${server || "(no agent_ref)"} · ${data.count} rollout(s)`),
    el("div", { class: "meta" }, `mean reward ${fmtReward(mean)}`, data.count > data.rows.length ? ` · the first ${data.rows.length} shown` : "",
      differs.size ? " · highlighted: verify fields that differ between the rollouts" : ""),
    first ? el("details", { class: "task" }, el("summary", {}, "the task (shared by every rollout)"),
      toolsBlock(first.responses_create_params && first.responses_create_params.tools), renderItems(inputItems(first))) : null,
    el("div", { class: "group", id: "group" }, columns));
  window.scrollTo(0, 0);
}

// The fields that differ between the rollouts first; those every rollout shares, folded.
function groupFields(fields, differs) {
  const different = {};
  const same = {};
  for (const [key, value] of Object.entries(fields)) (differs.has(key) ? different : same)[key] = value;
  return el("div", { class: "group-fields" },
    Object.keys(different).length ? kvTable(different, { highlight: differs }) : el("div", { class: "muted" }, "every verify field is the same in each rollout"),
    Object.keys(same).length ? el("details", { class: "extra" }, el("summary", {}, `the same in every rollout (${Object.keys(same).length})`), kvTable(same)) : null);
}

// ---- summary ----------------------------------------------------------------------------------

function histogram(bins) {
  if (!bins.length) return el("div", { class: "muted" }, "no rewards");
  const most = Math.max(1, ...bins.map((bin) => bin.count));
  return el("div", { class: "hist", title: "rewards" }, bins.map((bin) => {
    const bar = el("div", { class: "bar" });
    bar.style.height = `${Math.round((bin.count / most) * 100)}%`;
    return el("div", { class: "bin", title: `reward ${bin.label}: ${bin.count}` },
      el("div", { class: "count" }, bin.count ? String(bin.count) : ""), el("div", { class: "bar-box" }, bar),
      el("div", { class: "edge" }, bin.label));
  }));
}

function serverCard(entry) {
  return el("div", { class: "card" },
    el("h3", {}, entry.name),
    el("div", { class: "figures" },
      el("div", {}, el("span", { class: "label" }, "mean reward "), el("strong", {}, fmtReward(entry.mean_reward))),
      el("div", {}, `${fmtCount(entry.num_rollouts)} rollouts · ${fmtCount(entry.num_tasks)} tasks · ${fmtCount(entry.num_failed)} failed · ${fmtCount(entry.num_masked)} masked`),
      el("div", {}, entry.pass_at.map((p) => `pass@${p.k} ${p.percent.toFixed(1)}%`).join(" · "))),
    el("div", { class: "outcomes" }, el("span", { class: "label" }, "what the model did "),
      entry.outcomes.length
        ? entry.outcomes.map((o) => el("span", { class: "outcome", "data-outcome": o.outcome, title: o.outcome }, `${o.text} ${fmtCount(o.count)}`))
        : el("span", { class: "muted" }, "-")),
    histogram(entry.histogram));
}

function reasonsSection(title, what, reasons, none) {
  return el("div", { class: "reasons-section" },
    el("h3", {}, title),
    el("p", { class: "muted" }, what),
    reasons.length
      ? el("table", { class: "list reasons" },
          el("thead", {}, el("tr", {}, ["server", "count", "reason", "example"].map((h) => el("th", {}, h)))),
          el("tbody", {}, reasons.map((r) => el("tr", {},
            el("td", {}, r.server), el("td", { class: "num" }, String(r.count)),
            el("td", { class: "wrap" }, r.reason), el("td", { class: "failure-cell wrap" }, r.example)))))
      : el("p", { class: "muted" }, none));
}

async function renderSummary() {
  document.getElementById("nav-summary").classList.add("active");
  const box = el("div", {});
  fill(main, el("h1", {}, "Summary"), box);
  const load = async () => {
    const data = await api("/api/summary");
    clear(box);
    if (!data.files.length) box.appendChild(el("p", { class: "muted" }, "No rollout file."));
    for (const file of data.files) {
      box.appendChild(el("section", { class: "summary" },
        el("h2", {}, file.path),
        el("pre", { class: "metrics-table" }, file.table),
        file.unkeyed_rows ? el("div", { class: "warn-box" }, `${file.unkeyed_rows} row(s) without integer _ng_task_index/_ng_rollout_index are left out, as rollouts leaves them out`) : null,
        el("div", { class: "cards" }, [...file.servers, ...(file.servers.length > 1 ? [file.total] : [])].map(serverCard)),
        reasonsSection("Failed rollouts, by reason", "rollouts that ended without a reward (the row is in the failures file)",
          file.failures_by_reason.filter((r) => r.source === "failed rollout"), "No failed rollout."),
        reasonsSection("The servers' verdicts, by reason", "finished rollouts whose verify reply gave a reason (a wrong answer, a crash of the code under test, ...)",
          file.failures_by_reason.filter((r) => r.source !== "failed rollout"), "No verdict gave a reason.")));
    }
    if (!data.complete) box.appendChild(el("p", { class: "muted" }, "still indexing: these numbers will grow"));
  };
  await load();
  refreshCurrent = load;
}

// ---- errors -----------------------------------------------------------------------------------

async function renderErrors() {
  document.getElementById("nav-errors").classList.add("active");
  const box = el("div", {});
  fill(main, el("h1", {}, "Lines that are not rollout rows"), box);
  const load = async () => {
    const data = await api("/api/errors");
    clear(box);
    if (!data.errors.length) {
      box.appendChild(el("p", { class: "muted" }, "Every line is a rollout row."));
      return;
    }
    if (data.count > data.errors.length) box.appendChild(el("p", {}, `${fmtCount(data.count)} in all; the first ${data.errors.length} are listed.`));
    box.appendChild(el("table", { class: "list", id: "error-list" },
      el("thead", {}, el("tr", {}, ["file", "line", "", "problem"].map((h) => el("th", {}, h)))),
      el("tbody", {}, data.errors.map((e) => el("tr", { class: e.level },
        el("td", {}, e.path), el("td", { class: "num" }, String(e.line)), el("td", {}, e.level), el("td", {}, e.message))))));
  };
  await load();
  refreshCurrent = load;
}

// ---- following the files ------------------------------------------------------------------------

async function poll() {
  try {
    const data = await api("/api/status");
    const rows = data.files.reduce((n, f) => n + f.rows, 0);
    const errors = data.files.reduce((n, f) => n + f.errors, 0);
    const changed = !status || JSON.stringify(status.generation) !== JSON.stringify(data.generation) || status.errorCount !== errors;
    const failed = data.files.filter((f) => f.kind === "failures").reduce((n, f) => n + f.rows, 0);
    status = { ...data, errorCount: errors };
    live.textContent = `● live · ${fmtCount(rows - failed)} rollouts · ${fmtCount(failed)} failed · ${fmtCount(errors)} bad lines` + (data.complete ? "" : " · indexing");
    live.classList.remove("stale");
    if (changed && refreshCurrent) await refreshCurrent();
  } catch (error) {
    live.textContent = "○ the viewer is not answering";
    live.classList.add("stale");
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("hashchange", render);
(async () => {
  try {
    const data = await api("/api/status");
    status = { ...data, errorCount: data.files.reduce((n, f) => n + f.errors, 0) };
  } catch (error) {
    // the first poll reports it
  }
  await render();
  setTimeout(poll, POLL_MS);
})();
