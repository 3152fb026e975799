// The pairreg dashboard: a single page over the public API, with the user's bearer token.
// Pages are hash routes (#/deployment/NAME, #/pair/REF, #/flag/ID, #/request/ID, #/audit);
// each reads only declared operations, and shows an action only when `GET /v1/whoami` says
// the token's role may take it (the server checks every call anyway).
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const enc = encodeURIComponent;
const short = (d, n = 12) => (d ? `<code class="digest" title="${esc(d)}">${esc(String(d).slice(0, n))}</code>` : "-");
const pill = (s, cls = s) => `<span class="pill ${esc(cls)}">${esc(s)}</span>`;
const when = (t) => (t ? esc(new Date(t).toISOString().replace("T", " ").slice(0, 19)) : "-");
const secs = (t) => new Date(t).getTime() / 1000;
const fmt = (v, d = 3) => (v === null || v === undefined || Number.isNaN(v) ? "-" : Number(v).toFixed(d));
const ci = (c) => (Array.isArray(c) && c.length === 2 && c[0] !== null ? `[${fmt(c[0])}, ${fmt(c[1])}]` : "");
const pairLink = (digest, id) => (digest || id ? `<a href="#/pair/${enc(digest || id)}">${digest ? short(digest) : `pair ${esc(id)}`}</a>` : "-");
const nodata = (text) => `<div class="nodata" data-state="no-data">${esc(text)}</div>`;

let me = null; // whoami: {token, role, capabilities, mlflow_ui}
let served = null; // the set of GET path templates the server declares (OpenAPI)
const can = (cap) => !!me && me.capabilities.includes(cap);

function token() { return localStorage.getItem("pairreg-token") || ""; }

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new ApiError(resp.status, data.detail || resp.statusText);
  return data;
}

function explain(e) {
  if (e.status === 403) return "your token's role cannot read this";
  if (e.status === 404) return e.message || "not found";
  return e.message || String(e);
}

// Lists are oldest-first keyset pages: follow the cursor (bounded) to reach the newest rows.
async function newest(path, n, maxPages = 20) {
  let items = [], cursor = null;
  for (let i = 0; i < maxPages; i++) {
    const sep = path.includes("?") ? "&" : "?";
    const body = await api(cursor ? `${path}${sep}cursor=${enc(cursor)}` : path);
    items = items.concat(body.items).slice(-n);
    cursor = body.next_cursor;
    if (!cursor) break;
  }
  return items.reverse();
}

async function all(path, maxPages = 20) {
  let items = [], cursor = null;
  for (let i = 0; i < maxPages; i++) {
    const sep = path.includes("?") ? "&" : "?";
    const body = await api(cursor ? `${path}${sep}cursor=${enc(cursor)}` : path);
    items = items.concat(body.items);
    cursor = body.next_cursor;
    if (!cursor) break;
  }
  return items;
}

// Optional endpoints (online α, economics) are built by other parts of the service; the page
// asks the server's OpenAPI document whether they exist instead of probing for a 404.
async function servedPath(pattern) {
  if (served === null) {
    try {
      const schema = await (await fetch("/openapi.json")).json();
      served = Object.entries(schema.paths || {}).filter(([, ops]) => ops.get).map(([p]) => p);
    } catch (e) { served = []; }
  }
  return served.find((p) => pattern.test(p)) || null;
}
const fill = (template, value) => template.replace(/\{[^}]+\}/, enc(value));

function table(rows, columns, empty = "none") {
  if (!rows.length) return nodata(empty);
  const head = columns.map(([h, , cls]) => `<th class="${cls || ""}">${esc(h)}</th>`).join("");
  const body = rows.map((r) => `<tr>${columns.map(([, f, cls]) => `<td class="${cls || ""}">${f(r)}</td>`).join("")}</tr>`).join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>`;
}

function kv(pairs) {
  return `<table class="kv"><tbody>${pairs.filter(([, v]) => v !== undefined)
    .map(([k, v]) => `<tr><th>${esc(k)}</th><td>${v}</td></tr>`).join("")}</tbody></table>`;
}

function runLink(runId) {
  if (!runId) return "-";
  if (me && me.mlflow_ui) return `<a href="${esc(me.mlflow_ui)}/#/runs/${enc(runId)}" target="_blank" rel="noopener">${esc(runId.slice(0, 12))}</a>`;
  return `<code title="MLflow run (runs:/${esc(runId)})">${esc(runId.slice(0, 12))}</code>`;
}

function section(title, inner, attrs = "") { return `<section ${attrs}><h2>${esc(title)}</h2>${inner}</section>`; }

// ---------------------------------------------------------------------------------------- pages

async function overviewPage(view) {
  const [deps, flags, pairs, jobs] = await Promise.all([
    all("/v1/deployments?limit=200").catch((e) => e),
    api("/v1/drift?state=open&limit=200").then((b) => b.items).catch((e) => e),
    newest("/v1/pairs?limit=200", 50).catch((e) => e),
    newest("/v1/jobs?limit=500", 15).catch((e) => e),
  ]);
  const or = (v, f) => (v instanceof Error ? nodata(explain(v)) : f(v));
  view.innerHTML = `<h1>Overview</h1>
  ${section("Deployments", or(deps, (d) => table(d, [
    ["deployment", (x) => `<a href="#/deployment/${enc(x.name)}">${esc(x.name)}</a>`],
    ["policy", (x) => esc(x.policy_name)], ["live pair", (x) => pairLink(x.current_pair_digest, x.current_pair_id)],
    ["moves", (x) => esc(x.version), "num"], ["last move", (x) => when(x.updated_at)],
  ], "no deployments yet")))}
  <div class="grid">
  ${section("Open flags", or(flags, (f) => table(f, [
    ["flag", (x) => `<a href="#/flag/${x.id}">#${x.id}</a>`], ["kind", (x) => esc(x.kind)],
    ["pair", (x) => pairLink(x.pair_digest, x.pair_id)], ["severity", (x) => pill(x.severity)],
    ["opened", (x) => when(x.opened_at)],
  ], "no open flags")))}
  ${section("Recent jobs", or(jobs, (j) => table(j, [
    ["id", (x) => esc(x.id), "num"], ["kind", (x) => esc(x.kind)], ["state", (x) => pill(x.state)],
    ["attempts", (x) => esc(x.attempts), "num"], ["updated", (x) => when(x.updated_at)],
  ], "no jobs")))}
  </div>
  ${section("Pairs (newest first)", or(pairs, (p) => table(p, [
    ["pair", (x) => pairLink(x.pair_digest)], ["status", (x) => pill(x.status)],
    ["target", (x) => esc(x.target.ref)], ["drafter", (x) => esc(x.drafter?.ref ?? "-")],
    ["method", (x) => `${esc(x.method)} k=${esc(x.k)}`], ["acceptance", (x) => (x.lossy ? pill("LOSSY") : "lossless")],
    ["findings", (x) => esc(x.warnings.length), "num"],
  ], "no pairs registered")))}`;
}

function categoriesOf(measurements) {
  const cats = new Set();
  measurements.forEach((m) => Object.keys(m.categories || {}).forEach((c) => cats.add(c)));
  return [...cats].sort();
}

async function deploymentPage(view, name) {
  const dep = await api(`/v1/deployments/${enc(name)}`);
  const history = dep.history || [];
  const pairIds = new Set(history.flatMap((e) => [e.to_pair_id, e.from_pair_id]).filter((x) => x));
  const live = dep.current_pair_id ? await api(`/v1/pairs/${dep.current_pair_id}`) : null;
  const flags = (await all("/v1/drift?limit=500")).filter(
    (f) => pairIds.has(f.baseline_pair_id) || pairIds.has(f.pair_id));
  // α over time: the live pair, and the candidates a target change measured against it.
  const chartPairs = new Set(live ? [live.id] : []);
  flags.filter((f) => live && f.baseline_pair_id === live.id && f.pair_id).forEach((f) => chartPairs.add(f.pair_id));
  const ms = (await Promise.all([...chartPairs].map((id) => all(`/v1/measurements?pair=${id}&limit=500`)))).flat()
    .sort((a, b) => secs(a.created_at) - secs(b.created_at));
  const cats = categoriesOf(ms);
  const catVal = (m, c, f) => { const v = m.categories?.[c]?.[f]; return v === undefined ? null : v; };
  const ciAt = (m, c, i) => { const v = m.categories?.[c]?.alpha_ci; return Array.isArray(v) ? v[i] : null; };
  const markers = history.map((e) => ({ x: secs(e.at), kind: "move", short: `${e.action} #${e.seq}` }));
  if (live) {
    const versions = await all(`/v1/artifacts?lineage=${enc(live.target.lineage)}&limit=200`).catch(() => []);
    versions.filter((a) => a.version > 1).forEach((a) => markers.push({ x: secs(a.registered_at), kind: "target", short: `target v${a.version}` }));
  }
  flags.forEach((f) => {
    markers.push({ x: secs(f.opened_at), kind: "flag", short: `flag #${f.id}` });
    if (f.kind === "workload" && f.state === "resolved" && f.closed_at) markers.push({ x: secs(f.closed_at), kind: "recovery", short: `recovered #${f.id}` });
  });
  const onlinePath = await servedPath(/^\/v1\/deployments\/\{[^}]+\}\/online-alpha$/);
  view.innerHTML = `<h1>Deployment ${esc(dep.name)} <span class="muted">policy ${esc(dep.policy_name)} · ${esc(dep.version)} moves</span></h1>
  <div class="grid">
  ${section("Live pair", live ? kv([
    ["pair", pairLink(live.pair_digest)], ["status", pill(live.status)], ["target", esc(live.target.ref)],
    ["drafter", esc(live.drafter?.ref ?? "none")], ["method", `${esc(live.method)} k=${esc(live.k)}`],
    ["acceptance", live.lossy ? pill("LOSSY") : "lossless (strict)"],
  ]) : nodata("nothing is live on this deployment"))}
  ${section("Flags on its pairs", table(flags, [
    ["flag", (f) => `<a href="#/flag/${f.id}">#${f.id}</a>`], ["kind", (f) => esc(f.kind)], ["state", (f) => pill(f.state)],
    ["severity", (f) => pill(f.severity)], ["pair", (f) => pairLink(f.pair_digest, f.pair_id)], ["opened", (f) => when(f.opened_at)],
  ], "no flags"))}
  </div>
  ${section("α over time, per category (95% bands)", `<div class="chart" id="alpha-chart"></div>
    <p class="muted">Measurements of the live pair and of candidates measured against it after a target change (see the table below); dashed lines mark deployment moves, target changes and flags.</p>`)}
  ${section("Online acceptance and request volume (serving telemetry)", `<div class="chart" id="online-chart"></div><div class="chart" id="volume-chart"></div><div id="online-table"></div>`)}
  ${section("Timeline of moves", table([...history].reverse(), [
    ["#", (e) => esc(e.seq), "num"], ["when", (e) => when(e.at)], ["action", (e) => esc(e.action)],
    ["from", (e) => pairLink(e.from_pair_digest, e.from_pair_id)], ["to", (e) => pairLink(e.to_pair_digest, e.to_pair_id)],
    ["actor", (e) => esc(e.actor)], ["reason", (e) => esc(e.reason)],
  ], "never moved"))}
  ${section("Measurements on the chart", table([...ms].reverse(), [
    ["id", (m) => esc(m.id), "num"], ["when", (m) => when(m.created_at)], ["pair", (m) => pairLink(m.pair_digest)],
    ...cats.map((c) => [`α ${c}`, (m) => `${fmt(catVal(m, c, "alpha"))} <span class="muted">${ci(m.categories?.[c]?.alpha_ci)}</span>`, "num"]),
    ["MLflow run", (m) => runLink(m.mlflow_run_id)],
  ], "no measurements"))}`;
  // Online α (when the server has it) shares the α chart's time axis.
  const online = await onlineData(dep.name, onlinePath);
  const times = ms.map((m) => secs(m.created_at)).concat(markers.map((m) => m.x), online.rows.map((b) => secs(online.t(b))));
  const xRange = times.length ? window.pairregCharts.xRange(times, true) : undefined;
  window.pairregCharts.lineChart($("#alpha-chart"), {
    time: true, xRange,
    xs: ms.map((m) => secs(m.created_at)),
    series: cats.map((c) => ({
      label: c, ys: ms.map((m) => catVal(m, c, "alpha")),
      lo: ms.map((m) => ciAt(m, c, 0)), hi: ms.map((m) => ciAt(m, c, 1)),
    })),
    markers, y: { min: 0, max: 1, label: "α" }, empty: "no measurements yet",
  });
  onlineSection(online, xRange, markers);
}

// Online α from serving telemetry, read from the declared operation when the server has it:
// time buckets (oldest first) with requests, drafted/accepted counts, α and the validated α,
// and the state of each pair's sequential test.
async function onlineData(name, path) {
  const t = (b) => b.start ?? b.bucket_start ?? b.at ?? b.time ?? b.end;
  if (!path) return { t, rows: [], missing: "no online acceptance data: this server does not expose online α per deployment" };
  try {
    const body = await api(fill(path, name));
    const buckets = (body.buckets || body.items || body.series || []).filter((b) => t(b));
    return { t, body, rows: mergeBuckets(buckets, t, body.live_pair_digest) };
  } catch (e) { return { t, rows: [], missing: `no online acceptance data: ${explain(e)}` }; }
}

// Buckets come per pair; a bucket in which the deployment moved holds two. One point per
// time: counts added, α recomputed from them, the validated α of the live pair's bucket.
function mergeBuckets(buckets, t, livePair) {
  const byTime = new Map();
  for (const b of buckets) {
    const key = secs(t(b));
    const seen = byTime.get(key);
    if (!seen) { byTime.set(key, { ...b }); continue; }
    for (const f of ["requests", "tested", "drafted", "accepted"]) seen[f] = (seen[f] ?? 0) + (b[f] ?? 0);
    seen.alpha = seen.drafted ? seen.accepted / seen.drafted : null;
    if (b.pair_digest === livePair) { seen.validated_alpha = b.validated_alpha; seen.state = b.state; }
  }
  return [...byTime.entries()].sort((a, b) => a[0] - b[0]).map(([, b]) => b);
}

function onlineSection(online, xRange, markers) {
  const el = $("#online-chart");
  if (online.missing) {
    el.outerHTML = nodata(online.missing);
    $("#volume-chart").remove();
    return;
  }
  const { t, rows, body } = online;
  const validated = rows.map((b) => b.validated_alpha ?? body.validated_alpha ?? body.baseline_alpha ?? null);
  const band = rows.some((b) => b.alpha_low !== undefined);
  window.pairregCharts.lineChart(el, {
    time: true, xRange, markers,
    xs: rows.map((b) => secs(t(b))),
    series: [
      { label: "online α", ys: rows.map((b) => b.alpha ?? b.online_alpha ?? null),
        lo: band ? rows.map((b) => b.alpha_low ?? null) : null, hi: band ? rows.map((b) => b.alpha_high ?? null) : null },
      ...(validated.some((v) => v !== null) ? [{ label: "validated α", ys: validated, dash: [6, 4] }] : []),
    ],
    y: { min: 0, max: 1, label: "α" }, empty: "no requests with speculative counters yet",
  });
  const volume = rows.map((b) => b.requests ?? b.count ?? null);
  if (volume.some((v) => v !== null)) {
    window.pairregCharts.lineChart($("#volume-chart"), {
      time: true, xRange, height: 140,
      xs: rows.map((b) => secs(t(b))),
      series: [{ label: "requests per bucket", ys: volume }],
      y: { min: 0, max: Math.max(1, ...volume.filter((v) => v !== null)) * 1.15, label: "requests" },
    });
  } else $("#volume-chart").remove();
  const monitors = body.monitors || [];
  $("#online-table").innerHTML = (monitors.length ? `<h3>Sequential test (${esc(body.method ?? "")})</h3>` + table(monitors, [
    ["pair", (m) => pairLink(m.pair_digest)], ["live", (m) => (m.live ? "yes" : "no")],
    ["state", (m) => pill(m.state, { alarmed: "bad", watching: "good" }[m.state] || "")],
    ["validated α", (m) => fmt(m.validated_alpha), "num"], ["online α", (m) => fmt(m.alpha), "num"],
    ["requests tested", (m) => esc(m.tested ?? m.requests ?? "-"), "num"],
    ["e-value", (m) => fmt(m.e_value, 2), "num"], ["alarm at e ≥", (m) => (m.level ? fmt(1 / m.level, 0) : "-"), "num"],
    ["alarms", (m) => esc(m.alarms ?? 0), "num"],
    ["flag", (m) => (m.flag_id ? `<a href="#/flag/${m.flag_id}">#${m.flag_id}</a>` : "-")],
  ]) : "") + `<h3>Recent buckets</h3>` + table(rows.slice(-12).reverse(), [
    ["bucket", (b) => when(t(b))], ["requests", (b) => esc(b.requests ?? b.count ?? "-"), "num"],
    ["drafted", (b) => esc(b.drafted ?? "-"), "num"], ["accepted", (b) => esc(b.accepted ?? "-"), "num"],
    ["α", (b) => fmt(b.alpha ?? b.online_alpha), "num"], ["state", (b) => esc(b.state ?? "")],
  ], "no buckets");
}

function artifactPart(a) {
  if (!a) return nodata("no drafter model (prompt lookup)");
  const p = a.provenance || {};
  return kv([
    ["reference", esc(a.ref)], ["role", esc(a.role)], ["manifest digest", short(a.manifest_digest, 64)],
    ["tokenizer digest", short(a.tokenizer_digest, 64)], ["source", esc(a.source)],
    ["Hub commit", a.hub_commit ? short(a.hub_commit, 40) : "-"],
    ["files", `${esc(a.file_count)} files, ${(a.total_size / 1e6).toFixed(1)} MB`],
    ["architecture", esc(Object.entries(a.facts || {}).filter(([, v]) => typeof v !== "object").map(([k, v]) => `${k}=${v}`).join(", "))],
    ["publisher", esc(p.publisher ?? "-")], ["license", esc(p.license ?? "-")],
    ["training data", esc(p.training_data ?? "-")], ["base model", esc(p.base_model ?? "-")],
    ["trained against", esc(p.trained_against ?? "-")], ["training code", esc(p.training_code_revision ?? "-")],
    ["provenance missing", a.provenance_missing?.length ? esc(a.provenance_missing.join(", ")) : "nothing"],
    ["signature", a.signature ? esc(`${a.signature.kind || ""} ${a.signature.signer || ""}`) : "unsigned"],
    ["registered", `${when(a.registered_at)} by ${esc(a.registered_by)}`],
  ]);
}

async function pairPage(view, ref) {
  const pair = await api(`/v1/pairs/${enc(ref)}`);
  const [ms, vals] = await Promise.all([
    all(`/v1/measurements?pair=${pair.id}&limit=500`), all(`/v1/validations?pair=${pair.id}&limit=500`),
  ]);
  ms.reverse(); vals.reverse();
  const cats = categoriesOf(ms);
  const econPath = await servedPath(/^\/v1\/pairs\/\{[^}]+\}\/economics$/);
  const latest = ms.find((m) => cats.some((c) => Array.isArray(m.categories?.[c]?.per_position)));
  const actions = can("govern") && !["deprecated", "retired"].includes(pair.status)
    ? `<form class="inline" id="pair-action"><input type="text" id="pair-reason" placeholder="reason" required>
       <button type="submit" data-action="deprecate">Deprecate</button></form><div id="pair-action-out"></div>` : "";
  view.innerHTML = `<h1>Pair ${short(pair.pair_digest, 16)} ${pill(pair.status)} <span class="muted">${esc(pair.method)} k=${esc(pair.k)} · ${pair.lossy ? "LOSSY" : "lossless"}</span></h1>
  ${actions}
  <div class="grid">
  ${section("Target", artifactPart(pair.target))}
  ${section("Drafter", artifactPart(pair.drafter))}
  </div>
  <div class="grid">
  ${section("Compatibility findings", pair.warnings.length ? `<ul class="warn-list">${pair.warnings.map((w) => `<li>${esc(w)}</li>`).join("")}</ul>` : nodata("no findings: tokenizer, vocabulary and declared target agree"))}
  ${section("Speculation config", `<pre>${esc(JSON.stringify(pair.config, null, 2))}</pre><p class="muted">digest <code class="digest">${esc(pair.pair_digest)}</code></p>`)}
  </div>
  ${section("Measurements: α and τ per category (95% intervals)", ms.length ? ms.map((m) => `
    <h3>Measurement #${esc(m.id)} · ${when(m.created_at)} · suite ${esc(m.suite_name)} · runner ${esc(m.runner_version)} · ${esc(m.device || m.hardware?.device || "")} · MLflow ${runLink(m.mlflow_run_id)}</h3>
    ${table(Object.entries(m.categories || {}), [
      ["category", ([c]) => esc(c)], ["prompts", ([, s]) => esc(s.prompts ?? "-"), "num"],
      ["α", ([, s]) => fmt(s.alpha), "num"], ["α 95% CI", ([, s]) => ci(s.alpha_ci), "num"],
      ["τ", ([, s]) => fmt(s.tau, 2), "num"], ["τ 95% CI", ([, s]) => ci(s.tau_ci), "num"],
      ["expected α", ([, s]) => fmt(s.expected_alpha), "num"],
      ["per position", ([, s]) => (Array.isArray(s.per_position) ? s.per_position.map((v) => fmt(v, 2)).join(" · ") : "-")],
    ])}`).join("") : nodata("never measured"))}
  ${section("Acceptance per draft position (latest measurement)", `<div class="chart" id="position-chart"></div>`)}
  ${section("Validations", vals.length ? vals.map((v) => `
    <h3>Validation #${esc(v.id)} · ${when(v.created_at)} · policy ${esc(v.policy_name)} · ${v.passed ? pill("passed") : pill("failed")} · deployment ${esc(v.deployment ?? "-")} · MLflow ${runLink(v.mlflow_run_id)}</h3>
    ${table(v.gates, [
      ["gate", (g) => esc(g.name)], ["required", (g) => esc(g.required)], ["measured", (g) => esc(g.measured)],
      ["result", (g) => (g.passed ? pill("passed") : pill("failed"))], ["detail", (g) => esc(g.detail ?? "")],
    ])}`).join("") : nodata("never validated"))}
  ${section("Economics", `<div id="economics"></div>`)}`;
  const k = latest ? Math.max(...cats.map((c) => latest.categories[c]?.per_position?.length || 0)) : 0;
  window.pairregCharts.lineChart($("#position-chart"), {
    xs: Array.from({ length: k }, (_, i) => i),
    xLabels: Array.from({ length: k }, (_, i) => `position ${i + 1}`),
    series: latest ? cats.filter((c) => Array.isArray(latest.categories[c]?.per_position))
      .map((c) => ({ label: c, ys: latest.categories[c].per_position })) : [],
    y: { min: 0, max: 1, label: "accepted / step" }, empty: "no per-position counters recorded",
  });
  const econ = $("#economics");
  if (!econPath) econ.innerHTML = nodata("no economics figures: this server does not compute pair economics");
  else {
    try {
      economics(econ, await api(fill(econPath, pair.pair_digest)));
    } catch (e) { econ.innerHTML = nodata(`no economics figures: ${explain(e)}`); }
  }
  const form = $("#pair-action");
  if (form) form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api(`/v1/pairs/${enc(pair.pair_digest)}/deprecate`, { method: "POST", body: { reason: $("#pair-reason").value } });
      route();
    } catch (e) { $("#pair-action-out").innerHTML = `<p class="error">${esc(explain(e))}</p>`; }
  });
}

// Pair economics (GET /v1/pairs/{pair}/economics): predicted speed-up and cost by batch size
// on a hardware profile, and what the runner measured at batch 1. Unknown shapes as JSON.
function economics(el, e) {
  if (!Array.isArray(e.points)) { el.innerHTML = `<pre>${esc(JSON.stringify(e, null, 2))}</pre>`; return; }
  const hw = e.hardware || {}, m = e.measured;
  el.innerHTML = `<div class="grid">${kv([
    ["hardware", `${esc(hw.name)} <span class="muted">(${esc(hw.kind)})</span>`],
    ["τ", `${fmt(e.tau, 2)} <span class="muted">${esc(e.tau_source ?? "")}</span>`],
    ["context", `${esc(e.context)} tokens, ${esc(e.dtype)}`],
    ["largest batch", `${esc(e.max_batch_plain)} plain · ${esc(e.max_batch_spec)} with the drafter`],
    ["break-even batch", e.break_even_batch === null ? "none up to the largest batch" : esc(e.break_even_batch)],
    ["drafter memory share", fmt(e.draft_memory_fraction, 3)],
  ])}${m ? kv([
    ["measured at batch 1", `speed-up ${fmt(m.speedup_measured, 2)} (measurement #${esc(m.measurement_id)})`],
    ["predicted from its step times", fmt(m.speedup_predicted, 2)],
    ["prediction error", m.prediction_error === null ? "-" : `${fmt(100 * m.prediction_error, 1)}%`],
    ["draft / target cost c", fmt(m.cost_ratio_c, 3)],
  ]) : nodata("no measured speed-up yet")}</div>
  <div class="chart" id="economics-chart"></div>
  ${table(e.points, [
    ["batch", (p) => esc(p.batch), "num"], ["fits", (p) => (p.fits ? "yes" : pill("no", "bad"))],
    ["predicted speed-up", (p) => fmt(p.speedup, 2), "num"], ["bound", (p) => esc(p.bound)],
    ["plain tok/s", (p) => fmt(p.plain_tokens_per_s, 1), "num"], ["speculative tok/s", (p) => fmt(p.spec_tokens_per_s, 1), "num"],
    ["$ / 1M plain", (p) => fmt(p.cost_per_million_plain, 3), "num"], ["$ / 1M emitted", (p) => fmt(p.cost_per_million_emitted, 3), "num"],
  ])}${(e.notes || []).length ? `<ul class="muted">${e.notes.map((n) => `<li>${esc(n)}</li>`).join("")}</ul>` : ""}`;
  const top = Math.max(1.5, ...e.points.map((p) => p.speedup || 0)) * 1.1;
  window.pairregCharts.lineChart($("#economics-chart"), {
    xs: e.points.map((_, i) => i), xLabels: e.points.map((p) => `batch ${p.batch}`), height: 200,
    series: [{ label: "predicted speed-up", ys: e.points.map((p) => p.speedup) },
      { label: "break-even (1.0)", ys: e.points.map(() => 1), dash: [6, 4] }],
    y: { min: 0, max: top, label: "speed-up" },
  });
}

async function flagPage(view, id) {
  const f = await api(`/v1/drift/${enc(id)}`);
  const cats = f.effects?.categories || {};
  const names = Object.keys(cats).sort();
  const closable = can("govern") && f.state !== "resolved";
  view.innerHTML = `<h1>Flag #${esc(f.id)} ${pill(f.state)} ${pill(f.severity)} <span class="muted">${esc(f.kind)}</span></h1>
  ${section("Summary", kv([
    ["summary", esc(f.summary)], ["candidate pair", pairLink(f.pair_digest, f.pair_id)],
    ["baseline pair", f.baseline_pair_id ? pairLink(null, f.baseline_pair_id) : "-"],
    ["measurements", `baseline #${esc(f.baseline_measurement_id ?? "-")} → candidate #${esc(f.candidate_measurement_id ?? "-")}`],
    ["policy", esc(f.policy_name ?? "-")], ["margin / significance", `${esc(f.effects?.margin ?? "-")} / ${esc(f.effects?.significance ?? "-")}`],
    ["opened", `${when(f.opened_at)} by ${esc(f.opened_by)}`],
    ["closed", f.closed_at ? `${when(f.closed_at)} by ${esc(f.closed_by)}: ${esc(f.reason ?? "")}` : "-"],
  ]))}
  ${closable ? section("Act on this flag", `<form class="inline" id="flag-action">
     <input type="text" id="flag-reason" placeholder="reason (recorded in the audit log)" required>
     ${f.state === "open" ? `<button type="submit" data-action="ack">Acknowledge</button>` : ""}
     <button type="submit" data-action="resolve" class="primary">Resolve</button></form><div id="flag-action-out"></div>`) : ""}
  ${section("Baseline vs candidate per category", names.length ? `<div class="chart" id="flag-chart"></div>
    <p class="muted">Candidate interval: baseline α plus the 95% interval of the paired difference.</p>` + table(names, [
      ["category", (c) => esc(c)], ["prompts", (c) => esc(cats[c].prompts ?? "-"), "num"],
      ["baseline α", (c) => fmt(cats[c].baseline_alpha), "num"], ["candidate α", (c) => fmt(cats[c].candidate_alpha), "num"],
      ["difference", (c) => fmt(cats[c].diff), "num"], ["95% CI", (c) => `[${fmt(cats[c].ci_low)}, ${fmt(cats[c].ci_high)}]`, "num"],
      ["p-value", (c) => fmt(cats[c].p_value, 4), "num"], ["Holm p", (c) => fmt(cats[c].p_holm, 4), "num"],
      ["drifted", (c) => (cats[c].drifted ? pill("drifted") : pill("no", "good"))],
    ]) : `<pre>${esc(JSON.stringify(f.effects, null, 2))}</pre>`)}`;
  if (names.length) {
    const base = names.map((c) => cats[c].baseline_alpha);
    window.pairregCharts.lineChart($("#flag-chart"), {
      xs: names.map((_, i) => i), xLabels: names, whiskers: true,
      series: [
        { label: "baseline α", ys: base, points: true },
        { label: "candidate α", ys: names.map((c) => cats[c].candidate_alpha), points: true,
          lo: names.map((c, i) => (cats[c].ci_low === null ? null : base[i] + cats[c].ci_low)),
          hi: names.map((c, i) => (cats[c].ci_high === null ? null : base[i] + cats[c].ci_high)) },
      ],
      y: { min: 0, max: 1, label: "α" },
    });
  }
  const form = $("#flag-action");
  if (form) form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const action = ev.submitter?.dataset.action || "resolve";
    try {
      const path = { ack: `/v1/drift/${f.id}/ack`, resolve: `/v1/drift/${f.id}/resolve` }[action];
      await api(path, { method: "POST", body: { reason: $("#flag-reason").value } });
      route();
    } catch (e) { $("#flag-action-out").innerHTML = `<p class="error">${esc(explain(e))}</p>`; }
  });
}

async function requestPage(view, requestId) {
  if (!can("read_audit")) {
    view.innerHTML = `<h1>Request look-up</h1>${nodata(`role ${me.role} cannot read request records (auditors and admins can)`)}`;
    return;
  }
  view.innerHTML = `<h1>Request look-up</h1>
  <section><form class="inline" id="lookup"><input type="text" id="request-id" placeholder="request id" value="${esc(requestId || "")}" required aria-label="request id">
  <button type="submit" class="primary">Look up</button></form></section><div id="answer"></div><div id="recent"></div>`;
  $("#lookup").addEventListener("submit", (ev) => { ev.preventDefault(); location.hash = `#/request/${enc($("#request-id").value.trim())}`; });
  if (!requestId) {
    const page = await api("/v1/requests?limit=20");
    $("#recent").innerHTML = section(`Recent requests (${page.counts.total} recorded, ${page.counts.inconsistent} inconsistent)`, table(page.items, [
      ["request", (t) => `<a href="#/request/${enc(t.request_id)}">${esc(t.request_id)}</a>`], ["deployment", (t) => esc(t.deployment)],
      ["pair", (t) => pairLink(t.pair_digest)], ["served", (t) => when(t.served_at)],
      ["consistent", (t) => (t.consistent ? pill("consistent") : pill("inconsistent"))],
    ], "no requests recorded"));
    return;
  }
  let a;
  try { a = await api(`/v1/requests/${enc(requestId)}`); } catch (e) { $("#answer").innerHTML = section("Answer", `<p class="error">${esc(explain(e))}</p>`); return; }
  const t = a.tag, spec = t.spec || {};
  const drafted = spec.num_draft_tokens, accepted = spec.num_accepted_draft_tokens;
  $("#answer").innerHTML = `<div class="grid">
  ${section("Which pair served it", kv([
    ["request", `<code id="answer-request">${esc(t.request_id)}</code>`],
    ["pair", `<span id="answer-pair">${pairLink(t.pair_digest)}</span> <code class="digest">${esc(t.pair_digest)}</code>`],
    ["deployment", `<a href="#/deployment/${enc(t.deployment)}">${esc(t.deployment)}</a>`],
    ["served at", when(t.served_at)],
    ["consistency", t.consistent ? pill("consistent") + " the pair was live on the deployment then" : pill("inconsistent") + ` live then: ${short(a.live_pair_digest)}`],
    ["target", esc(a.pair.target?.ref)], ["drafter", esc(a.pair.drafter?.ref ?? "none")],
    ["validation", a.validation ? `#${esc(a.validation.id)} ${a.validation.passed ? pill("passed") : pill("failed")}` : "-"],
    ["flags open on the pair", a.open_flags.length ? a.open_flags.map((f) => `<a href="#/flag/${f.id}">#${esc(f.id)}</a>`).join(", ") : "none"],
  ]))}
  ${section("Counters", kv([
    ["input tokens", esc(t.input_tokens)], ["output tokens", esc(t.output_tokens)],
    ["speculative steps", esc(spec.num_spec_steps ?? "-")], ["draft tokens", esc(drafted ?? "-")],
    ["accepted draft tokens", esc(accepted ?? "-")], ["α of this request", drafted ? fmt(accepted / drafted) : "-"],
    ["ingest batch", `#${esc(t.batch_id)} · audit seq ${esc(a.batch?.audit_seq ?? "-")}`], ["tag digest", short(t.tag_digest, 64)],
  ]) + `<p><button type="button" id="bundle">Download offline bundle</button> <span id="bundle-out" class="muted"></span></p>`)}
  </div>`;
  $("#bundle").addEventListener("click", async () => {
    try {
      const bundle = await api(`/v1/requests/${enc(requestId)}/bundle`);
      const url = URL.createObjectURL(new Blob([JSON.stringify(bundle, null, 2)], { type: "application/json" }));
      const link = document.createElement("a");
      link.href = url; link.download = `pairreg-bundle-${requestId}.json`; link.id = "bundle-link";
      link.textContent = link.download;
      $("#bundle-out").replaceChildren("saved as ", link);
      link.click();
    } catch (e) { $("#bundle-out").textContent = explain(e); }
  });
}

const ENTITY_PAGES = { pair: "pair", drift_flag: "flag", deployment: "deployment" };

function entityLink(e) {
  const label = esc(`${e.entity_type}:${e.entity_id}`);
  const page = ENTITY_PAGES[e.entity_type];
  return page ? `<a href="#/${page}/${enc(e.entity_id)}">${label}</a>` : label;
}

async function auditPage(view, query) {
  if (!can("read_audit")) {
    view.innerHTML = `<h1>Audit</h1>${nodata(`role ${me.role} cannot read the audit log (auditors and admins can)`)}`;
    return;
  }
  const filters = ["action", "actor", "entity_type", "entity_id"];
  const [log, checkpoint] = await Promise.all([
    api("/v1/audit/verify"),
    api("/v1/audit/log-checkpoints/latest").catch((e) => e),
  ]);
  const qs = filters.filter((f) => query.get(f)).map((f) => `&${f}=${enc(query.get(f))}`).join("");
  const events = await newest(`/v1/audit/events?limit=500${qs}`, 100);
  view.innerHTML = `<h1>Audit</h1>
  <div class="grid">
  ${section("Audit log", kv([
    ["status", log.ok ? pill("intact", "good") : pill("broken", "bad")], ["events", esc(log.tree_size)],
    ["root", log.root_hash ? short(log.root_hash, 16) : "-"],
    ["first broken", log.first_bad_seq === null ? "-" : `#${esc(log.first_bad_seq)}: ${esc(log.reason)}`],
    ["signed checkpoints", log.signed_ok === null ? "-" : `${log.signed_ok ? pill("consistent", "good") : pill("diverged", "bad")} ${esc(log.signed_detail)}`],
  ]), 'id="log"')}
  ${section("Latest signed checkpoint", checkpoint instanceof Error ? nodata(explain(checkpoint)) : kv([
    ["origin", esc(checkpoint.origin)], ["tree size", esc(checkpoint.tree_size)], ["root", short(checkpoint.root_hash, 64)],
    ["signed", `${when(checkpoint.signed_at)} by ${esc(checkpoint.signed_by)}`], ["note", `<pre>${esc(checkpoint.note)}</pre>`],
  ]))}
  </div>
  <section><h2>Recent events</h2>
  <form class="inline" id="filter">${filters.map((f) => `<input type="text" name="${f}" placeholder="${f.replace("_", " ")}" value="${esc(query.get(f) || "")}" aria-label="${f}">`).join("")}
  <button type="submit">Filter</button></form>
  <div id="events" data-count="${events.length}">${table(events, [
    ["seq", (e) => esc(e.seq), "num"], ["time", (e) => when(e.occurred_at)], ["actor", (e) => esc(e.actor)],
    ["action", (e) => esc(e.action)], ["entity", entityLink],
  ], "no events match")}</div></section>`;
  $("#filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams([...new FormData(ev.target)].filter(([, v]) => v));
    location.hash = `#/audit${q.toString() ? `?${q}` : ""}`;
  });
}

// ---------------------------------------------------------------------------------------- shell

const PAGES = {
  "": overviewPage,
  deployment: deploymentPage,
  pair: pairPage,
  flag: flagPage,
  request: requestPage,
  audit: (view, arg, query) => auditPage(view, query),
};

function renderNav(page) {
  const links = [["#/", "Overview", ""]];
  if (can("read_audit")) links.push(["#/request", "Request look-up", "request"], ["#/audit", "Audit", "audit"]);
  $("#nav").innerHTML = links.map(([href, label, p]) => `<a href="${href}" class="${p === page ? "active" : ""}">${esc(label)}</a>`).join("");
}

async function signIn() {
  $("#login").hidden = true; $("#logout").hidden = true;
  if (!token()) { me = null; return false; }
  try { me = await api("/v1/whoami"); } catch (e) { me = null; $("#who").textContent = explain(e); return false; }
  $("#who").textContent = `${me.token ? `token ${me.token}` : me.actor} · role ${me.role}`;
  $("#logout").hidden = false;
  return true;
}

async function route() {
  const view = $("#view");
  const [path, qs] = location.hash.replace(/^#\/?/, "").split("?");
  const [page, ...rest] = path.split("/");
  const arg = decodeURIComponent(rest.join("/"));
  view.dataset.state = "loading";
  view.dataset.page = page || "overview";
  view.dataset.route = location.hash || "#/";
  if (!me) {
    renderNav(null);
    $("#login").hidden = false;
    view.innerHTML = `<h1>Sign in</h1><p>Paste an API token above (for the embedded registry, the admin token is in <code>$PAIRREG_HOME/credentials</code>; <code>pairreg token create --role reader</code> makes a read-only one).</p>`;
    view.dataset.state = "signed-out";
    return;
  }
  renderNav(page);
  const render = PAGES[page];
  try {
    if (!render) throw new ApiError(404, `no page ${page}`);
    await render(view, arg, new URLSearchParams(qs || ""));
    view.dataset.state = "ready";
  } catch (e) {
    view.innerHTML = `<h1>${esc(page || "overview")}</h1><p class="error" data-state="error">${esc(explain(e))}</p>`;
    view.dataset.state = "error";
  }
}

// `/dashboard#token=prt_…` signs in too (a fragment never reaches the server or its logs).
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) {
  localStorage.setItem("pairreg-token", fromHash);
  history.replaceState(null, "", location.pathname);
}

$("#login").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  localStorage.setItem("pairreg-token", $("#token").value.trim());
  $("#token").value = "";
  await signIn();
  route();
});
$("#logout").addEventListener("click", () => {
  localStorage.removeItem("pairreg-token");
  me = null; $("#who").textContent = "";
  route();
  $("#logout").hidden = true;
});
window.addEventListener("hashchange", route);
signIn().then(route);
