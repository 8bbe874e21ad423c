// The playground page. It draws what the server's views answer; every number comes from the
// project's Python code (bert_tf/playground/views.py), none is computed here.
"use strict";

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));
const SHARED_VIEWS = new Set(["represent", "mask", "attention"]);
const state = { info: null, view: "represent", selected: 0, recordsStart: 0, layer: 0, head: 0 };

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

async function api(view, body) {
  let response;
  try {
    response = await fetch(`/api/${view}`, {
      method: body === undefined ? "GET" : "POST",
      headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new Error(`The playground server does not answer (${error.message}). Is it still running?`);
  }
  let reply = null;
  try {
    reply = await response.json();
  } catch (error) {
    reply = null;
  }
  if (!response.ok) {
    throw new Error((reply && reply.error) || `The server answered HTTP ${response.status}.`);
  }
  return reply;
}

function panel(view) {
  return document.getElementById(`view-${view}`);
}

function say(view, text, isError = false) {
  const box = $(".message", panel(view));
  box.textContent = text || "";
  box.classList.toggle("error", Boolean(isError));
}

// Runs one request of a view: marks the panel busy, shows an error as the panel's message, and
// counts finished requests in data-version (what the browser tests wait on). A reply to a
// request that a newer one has overtaken is dropped.
async function run(view, work) {
  const node = panel(view);
  const ticket = (node.ticket = (node.ticket || 0) + 1);
  const current = () => ticket === node.ticket;
  node.dataset.state = "loading";
  try {
    await work(current);
    if (current()) node.dataset.state = "ready";
  } catch (error) {
    if (current()) {
      say(view, error.message, true);
      node.dataset.state = "error";
    }
  }
  if (current()) node.dataset.version = String(Number(node.dataset.version || 0) + 1);
}

function texts() {
  return { text_a: $("#text-a").value, text_b: $("#text-b").value };
}

function notices(view, reply, extra = "") {
  const parts = [...(reply.notices || [])];
  if (extra) parts.push(extra);
  say(view, parts.join(" "));
}

function percent(p) {
  return `${(100 * p).toFixed(p < 0.001 ? 3 : 1)}%`;
}

// ---------------------------------------------------------------------------------------------
// 1. Input representation
// ---------------------------------------------------------------------------------------------

function represent() {
  return run("represent", async (current) => {
    const reply = await api("represent", texts());
    if (!current()) return;
    notices("represent", reply);
    const body = $("#represent-table tbody");
    body.replaceChildren();
    state.selected = Math.min(state.selected, reply.rows.length - 1);
    for (const row of reply.rows) {
      const button = el("button", {
        type: "button",
        "aria-pressed": String(row.index === state.selected),
        "data-index": row.index,
        text: row.token,
        onclick: () => selectToken(row.index),
      });
      body.append(
        el(
          "tr",
          { class: `seg-${row.segment}`, "data-index": row.index },
          el("td", { text: row.index }),
          el("td", { class: "token" }, button),
          el("td", { text: row.id }),
          el("td", { text: row.segment === 0 ? "A (0)" : "B (1)", "data-segment": row.segment }),
          el("td", { text: row.position }),
        ),
      );
    }
    await embeddings(current);
  });
}

function selectToken(index) {
  state.selected = index;
  for (const button of $$("#represent-table tbody button")) {
    button.setAttribute("aria-pressed", String(Number(button.dataset.index) === index));
  }
  run("represent", (current) => embeddings(current));
}

async function embeddings(current) {
  const token = $(`#represent-table tbody button[data-index="${state.selected}"]`);
  $("#embedding-token").textContent = token ? `“${token.textContent}” (index ${state.selected})` : "—";
  const box = $(".model-message", panel("represent"));
  const strips = $("#strips");
  if (state.info.missing.model) {
    box.textContent = state.info.missing.model;
    strips.replaceChildren();
    return;
  }
  box.textContent = "";
  const reply = await api("embeddings", { ...texts(), index: state.selected });
  if (!current()) return;
  const names = [
    ["token", "token embedding (word table row)"],
    ["segment", `segment embedding (${reply.segment === 0 ? "A" : "B"})`],
    ["position", `position embedding (${reply.index})`],
    ["sum", "sum of the three"],
    ["layer_norm", "after LayerNorm: what layer 1 gets"],
  ];
  strips.replaceChildren(...names.map(([name, label]) => strip(name, label, reply.vectors[name])));
}

function strip(name, label, vector) {
  const canvas = el("canvas", { width: vector.length, height: 1, "data-name": name });
  const context = canvas.getContext("2d");
  const image = context.createImageData(vector.length, 1);
  const scale = Math.max(1e-9, ...vector.map(Math.abs));
  vector.forEach((value, i) => {
    const [r, g, b] = diverging(value / scale);
    image.data.set([r, g, b, 255], 4 * i);
  });
  context.putImageData(image, 0, 0);
  const norm = Math.sqrt(vector.reduce((sum, v) => sum + v * v, 0));
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", `${label}: ${vector.length} values, norm ${norm.toFixed(3)}`);
  canvas.title = `${label}: min ${Math.min(...vector).toFixed(4)}, max ${Math.max(...vector).toFixed(4)}`;
  return el(
    "div",
    { class: "strip" },
    el(
      "div",
      { class: "label" },
      el("span", { text: label }),
      el("span", { text: `|v| = ${norm.toFixed(3)}, max |x| = ${scale.toFixed(3)}` }),
    ),
    canvas,
  );
}

// Blue (negative) - white - red (positive), for x in [-1, 1].
function diverging(x) {
  const t = Math.max(-1, Math.min(1, x));
  const white = [247, 247, 247];
  const end = t < 0 ? [33, 102, 172] : [178, 24, 43];
  const a = Math.abs(t);
  return white.map((w, i) => Math.round(w + (end[i] - w) * a));
}

// ---------------------------------------------------------------------------------------------
// 2. MLM masking
// ---------------------------------------------------------------------------------------------

const MASKING_SUMMARY = {
  token: ".",
  whole_word: "; whole words only.",
  span: "; spans of whole words (mean 3.8 words), each replaced as one.",
};

function mask() {
  return run("mask", async (current) => {
    const reply = await api("mask", {
      ...texts(),
      seed: $("#mask-seed").value,
      rate: Number($("#mask-rate").value) / 100,
      masking: $("#mask-kind").value,
      mask_token_prob: Number($("#mask-as-mask").value) / 100,
      random_token_prob: Number($("#mask-as-random").value) / 100,
    });
    if (!current()) return;
    notices("mask", reply, reply.missing ? `Model's top 5: ${reply.missing}` : "");
    $("#mask-summary").textContent =
      `${reply.masked} of ${reply.length} tokens masked (seed ${reply.seed}): ` +
      `max(1, round(${reply.length} × ${reply.rate.toFixed(2)})) = ${reply.wanted}, ` +
      `at most max_predictions_per_seq = ${reply.cap}` +
      MASKING_SUMMARY[reply.masking] +
      ` Of them ${Math.round(reply.mask_token_prob * 100)}% become [MASK], ` +
      `${Math.round(reply.random_token_prob * 100)}% a random token, the rest stay.`;
    const body = $("#mask-table tbody");
    body.replaceChildren();
    for (const row of reply.rows) {
      const rule = row.rule === "[MASK]" ? "mask" : row.rule;
      const top = row.top.map((t) => `${t.token} ${t.probability.toFixed(3)}`).join(" · ");
      body.append(
        el(
          "tr",
          { class: `seg-${row.segment}${row.rule ? " masked" : ""}`, "data-index": row.index },
          el("td", { text: row.index }),
          el("td", { class: "token", text: row.original }),
          el("td", { class: `token${row.rule ? ` rule-${rule}` : ""}`, text: row.input }),
          el("td", { class: "token", text: row.label }),
          el("td", { text: row.rule }),
          el("td", { class: "top", text: top }),
        ),
      );
    }
  });
}

function nextSeed(input) {
  const value = input.value.trim();
  if (/^\d+$/.test(value)) input.value = String(BigInt(value) + 1n);
}

// ---------------------------------------------------------------------------------------------
// 3. Next sentence
// ---------------------------------------------------------------------------------------------

function pairs() {
  return run("nsp", async (current) => {
    const label = $("input[name=nsp-label]:checked").value;
    const reply = await api("pairs", { seed: $("#nsp-seed").value, label });
    if (!current()) return;
    notices("nsp", reply, reply.missing ? `P(IsNext): ${reply.missing}` : "");
    $("#nsp-corpus").textContent = `${reply.corpus} (${reply.documents} documents in its first block)`;
    const cards = reply.pairs.map((pair, i) => {
      const where = (part) =>
        `document ${part.document}, sentence${part.first === part.last ? ` ${part.first}` : `s ${part.first}–${part.last}`} ` +
        `of ${part.sentences} (${part.tokens} tokens)`;
      const probability =
        pair.probability === null
          ? null
          : el(
              "span",
              { class: "prob", "data-probability": pair.probability },
              `model's P(IsNext) = ${pair.probability.toFixed(4)}`,
              el("span", { class: "bar", "data-width": pair.probability }),
            );
      const card = el(
        "article",
        { class: "card pair", "data-label": pair.label },
        el(
          "div",
          { class: "head" },
          el("span", { class: "label", text: `${i + 1}. ${pair.label}` }),
          el("span", { class: "where", text: `next_sentence_labels = ${pair.next_sentence_label}, target length ${pair.target_seq_length}` }),
          probability,
        ),
        el("p", {}, el("span", { class: "seg", text: "A" }), el("span", { class: "text-a", text: pair.a.text })),
        el("p", { class: "where where-a", text: `A: ${where(pair.a)}`, "data-document": pair.a.document, "data-first": pair.a.first, "data-last": pair.a.last }),
        el("p", {}, el("span", { class: "seg", text: "B" }), el("span", { class: "text-b", text: pair.b.text })),
        el("p", { class: "where where-b", text: `B: ${where(pair.b)}${pair.label === "NotNext" ? " — a random document" : " — the sentences right after A"}`, "data-document": pair.b.document, "data-first": pair.b.first, "data-last": pair.b.last }),
      );
      return card;
    });
    $("#nsp-pairs").replaceChildren(...cards);
    for (const bar of $$("#nsp-pairs .bar")) bar.style.width = `${Math.round(80 * Number(bar.dataset.width))}px`;
  });
}

function scoreOwnPair(event) {
  event.preventDefault();
  run("nsp", async (current) => {
    $("#own-result").textContent = "";
    const reply = await api("score_pair", { text_a: $("#own-a").value, text_b: $("#own-b").value });
    if (!current()) return;
    notices("nsp", reply);
    $("#own-result").textContent = `P(IsNext) = ${reply.probability.toFixed(4)}`;
    $("#own-result").dataset.probability = reply.probability;
  });
}

// ---------------------------------------------------------------------------------------------
// 4. Fill-mask
// ---------------------------------------------------------------------------------------------

function fillMask(event) {
  if (event) event.preventDefault();
  return run("fill", async (current) => {
    $("#fill-results").replaceChildren();
    $("#fill-filled").textContent = "";
    const reply = await api("fill_mask", { text: $("#fill-text").value, top_k: $("#fill-k").value });
    if (!current()) return;
    notices("fill", reply);
    $("#fill-filled").textContent = `Filled: ${reply.filled}`;
    const cards = reply.masks.map((m, i) =>
      el(
        "article",
        { class: "card mask-result", "data-position": m.position },
        el("div", { class: "head" }, el("span", { class: "label", text: `[MASK] ${i + 1} of ${reply.masks.length}` }), el("span", { class: "where", text: `position ${m.position} in the packed input` })),
        el(
          "table",
          { class: "data" },
          el("thead", {}, el("tr", {}, el("th", { text: "#" }), el("th", { text: "Token" }), el("th", { text: "Id" }), el("th", { text: "Probability" }))),
          el(
            "tbody",
            {},
            ...m.tokens.map((token, rank) =>
              el(
                "tr",
                { "data-probability": m.probabilities[rank] },
                el("td", { text: rank + 1 }),
                el("td", { class: "token", text: token }),
                el("td", { text: m.token_ids[rank] }),
                el("td", { class: "prob", text: m.probabilities[rank].toFixed(4) }),
              ),
            ),
          ),
        ),
      ),
    );
    $("#fill-results").replaceChildren(...cards);
  });
}

// ---------------------------------------------------------------------------------------------
// 5. Records
// ---------------------------------------------------------------------------------------------

function records() {
  return run("records", async (current) => {
    const path = $("#records-path").value;
    if (!path.trim()) {
      say("records", "Type the path of a .tfrecord file written by create_pretraining_data, then Open.");
      return;
    }
    const reply = await api("records", {
      path,
      start: state.recordsStart,
      limit: $("#records-limit").value,
    });
    if (!current()) return;
    notices("records", reply);
    const count = reply.instances.length;
    $("#records-summary").textContent = count
      ? `Records ${reply.start}–${reply.start + count - 1} of ${reply.path}${reply.more ? "; more follow." : "; the end of the file."}`
      : "";
    $("#records-prev").disabled = reply.start === 0;
    $("#records-next").disabled = !reply.more;
    $("#records-list").replaceChildren(...reply.instances.map(recordCard));
  });
}

function recordCard(x) {
  const masked = new Map(x.masked.map((m) => [m.position, m]));
  const chips = x.tokens.map((token, i) => {
    const m = masked.get(i);
    const rule = m ? (m.kind === "[MASK]" ? "mask" : m.kind) : "";
    return el(
      "span",
      {
        class: `chip seg-${x.segment_ids[i]}${m ? ` rule-${rule}` : ""}`,
        title: m ? `${m.kind}: original “${m.original}”` : `segment ${x.segment_ids[i]}`,
        "data-position": i,
      },
      token,
      m && m.kind !== "kept" ? el("span", { class: "orig", text: ` (${m.original})` }) : null,
    );
  });
  return el(
    "article",
    { class: "card record", "data-index": x.index },
    el(
      "div",
      { class: "head" },
      el("span", { class: "label", text: `Record ${x.index}: ${x.label}` }),
      el("span", { class: "where", text: `next_sentence_labels = ${x.is_random_next ? 1 : 0}; ${x.tokens.length} tokens of ${x.max_seq_length}; ${x.masked.length} masked of at most ${x.max_predictions_per_seq}` }),
    ),
    el("p", {}, el("span", { class: "seg", text: "A" }), el("span", { class: "text-a", text: x.text_a })),
    el("p", {}, el("span", { class: "seg", text: "B" }), el("span", { class: "text-b", text: x.text_b })),
    el("div", { class: "tokens", "aria-label": "The input as the model sees it" }, ...chips),
    el(
      "table",
      { class: "data masked-table" },
      el("thead", {}, el("tr", {}, el("th", { text: "Position" }), el("th", { text: "Input" }), el("th", { text: "Rule" }), el("th", { text: "Original" }))),
      el(
        "tbody",
        {},
        ...x.masked.map((m) =>
          el(
            "tr",
            { "data-position": m.position },
            el("td", { text: m.position }),
            el("td", { class: `token rule-${m.kind === "[MASK]" ? "mask" : m.kind}`, text: m.shown }),
            el("td", { text: m.kind }),
            el("td", { class: "token", text: m.original }),
          ),
        ),
      ),
    ),
  );
}

// ---------------------------------------------------------------------------------------------
// 6. Attention
// ---------------------------------------------------------------------------------------------

function attention() {
  return run("attention", async (current) => {
    const blocked = Boolean(state.info.missing.model);
    for (const node of $$("#view-attention .controls, #view-attention .columns")) node.hidden = blocked;
    if (blocked) {
      say("attention", state.info.missing.model);
      $("#att-matrix").replaceChildren();
      $("#att-overview").replaceChildren();
      return;
    }
    const reply = await api("attention", { ...texts(), layer: state.layer, head: state.head });
    if (!current()) return;
    notices("attention", reply);
    drawMatrix(reply);
    drawOverview(reply);
  });
}

function drawMatrix(reply) {
  const tokens = reply.tokens;
  // The darkest cell is the head's largest weight, so that a near-uniform head still shows its shape.
  const top = Math.max(1e-9, ...reply.matrix.map((row) => Math.max(...row)));
  $("#att-scale").textContent = `Darkest: ${top.toFixed(3)} (the largest weight of this head); hover a cell for its value.`;
  const head = el("thead", {}, el("tr", {}, el("th", { text: "" }), ...tokens.map((t) => el("th", { scope: "col", text: t }))));
  const rows = reply.matrix.map((row, i) =>
    el(
      "tr",
      { "data-row": i },
      el("th", { scope: "row", text: tokens[i] }),
      ...row.map((value, j) => {
        const cell = el("td", { "data-value": value, title: `${tokens[i]} → ${tokens[j]}: ${value.toFixed(4)}` });
        cell.style.backgroundColor = `rgba(36, 86, 200, ${Math.min(1, value / top).toFixed(3)})`;
        return cell;
      }),
    ),
  );
  const table = $("#att-matrix");
  table.setAttribute("aria-label", `Attention of layer ${reply.layer + 1}, head ${reply.head + 1}`);
  table.dataset.layer = reply.layer;
  table.dataset.head = reply.head;
  table.replaceChildren(head, el("tbody", {}, ...rows));
}

function drawOverview(reply) {
  const box = $("#att-overview");
  box.style.gridTemplateColumns = `auto repeat(${reply.heads}, auto)`;
  const n = reply.tokens.length;
  const children = [el("span", { class: "axis", text: "" })];
  for (let h = 0; h < reply.heads; h += 1) children.push(el("span", { class: "axis", text: `H${h + 1}` }));
  reply.overview.forEach((heads, layer) => {
    children.push(el("span", { class: "axis", text: `L${layer + 1}` }));
    heads.forEach((encoded, head) => {
      const canvas = el("canvas", { width: n, height: n });
      const levels = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
      const top = Math.max(1, ...levels);
      const context = canvas.getContext("2d");
      const image = context.createImageData(n, n);
      levels.forEach((level, i) => {
        const a = level / top;
        image.data.set([Math.round(255 - 219 * a), Math.round(255 - 169 * a), Math.round(255 - 55 * a), 255], 4 * i);
      });
      context.putImageData(image, 0, 0);
      const selected = layer === reply.layer && head === reply.head;
      children.push(
        el(
          "button",
          {
            type: "button",
            "aria-pressed": String(selected),
            "aria-label": `layer ${layer + 1}, head ${head + 1}`,
            onclick: () => chooseHead(layer, head),
          },
          canvas,
        ),
      );
    });
  });
  box.replaceChildren(...children);
}

function chooseHead(layer, head) {
  state.layer = layer;
  state.head = head;
  $("#att-layer").value = String(layer);
  $("#att-head").value = String(head);
  attention();
}

// ---------------------------------------------------------------------------------------------
// Tabs, events, start
// ---------------------------------------------------------------------------------------------

const REFRESH = { represent, mask, nsp: pairs, fill: () => fillMask(), records, attention };

function activate(view, focus = false) {
  state.view = view;
  for (const tab of $$("[role=tab]")) {
    const selected = tab.id === `tab-${view}`;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    if (selected && focus) tab.focus();
  }
  for (const node of $$("[role=tabpanel]")) node.hidden = node.id !== `view-${view}`;
  $("#shared-input").hidden = !SHARED_VIEWS.has(view);
  if (view !== "records" || $("#records-path").value.trim()) REFRESH[view]();
  else records();
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

function wire() {
  const tabs = $$("[role=tab]");
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => activate(tab.id.slice(4)));
    tab.addEventListener("keydown", (event) => {
      const moves = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 };
      if (!(event.key in moves)) return;
      event.preventDefault();
      const next = tabs[(moves[event.key] + tabs.length) % tabs.length];
      activate(next.id.slice(4), true);
    });
  });
  const refreshShared = debounce(() => {
    if (SHARED_VIEWS.has(state.view)) REFRESH[state.view]();
  }, 300);
  $("#text-a").addEventListener("input", refreshShared);
  $("#text-b").addEventListener("input", refreshShared);

  $("#represent-table tbody").addEventListener("keydown", (event) => {
    const step = { ArrowDown: 1, ArrowUp: -1 }[event.key];
    if (!step) return;
    const buttons = $$("#represent-table tbody button");
    const next = buttons[Math.max(0, Math.min(buttons.length - 1, state.selected + step))];
    if (next) {
      event.preventDefault();
      next.focus();
      next.click();
    }
  });

  const maskLater = debounce(mask, 200);
  $("#mask-rate").addEventListener("input", () => {
    $("#mask-rate-out").textContent = `${$("#mask-rate").value}%`;
    maskLater();
  });
  $("#mask-seed").addEventListener("input", maskLater);
  $("#mask-kind").addEventListener("change", mask);
  $("#mask-as-mask").addEventListener("input", maskLater);
  $("#mask-as-random").addEventListener("input", maskLater);
  $("#mask-again").addEventListener("click", () => {
    nextSeed($("#mask-seed"));
    mask();
  });

  for (const radio of $$("input[name=nsp-label]")) radio.addEventListener("change", pairs);
  $("#nsp-seed").addEventListener("input", debounce(pairs, 300));
  $("#nsp-again").addEventListener("click", () => {
    nextSeed($("#nsp-seed"));
    pairs();
  });
  $("#own-pair").addEventListener("submit", scoreOwnPair);

  $("#fill-form").addEventListener("submit", fillMask);
  $("#fill-text").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) fillMask(event);
  });

  $("#records-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.recordsStart = 0;
    records();
  });
  $("#records-prev").addEventListener("click", () => {
    state.recordsStart = Math.max(0, state.recordsStart - Number($("#records-limit").value || 1));
    records();
  });
  $("#records-next").addEventListener("click", () => {
    state.recordsStart += Number($("#records-limit").value || 1);
    records();
  });

  $("#att-layer").addEventListener("change", () => chooseHead(Number($("#att-layer").value), state.head));
  $("#att-head").addEventListener("change", () => chooseHead(state.layer, Number($("#att-head").value)));
}

function describe(info) {
  const casing = info.do_lower_case ? "uncased" : "cased";
  const vocab = `vocabulary of ${info.vocab_size.toLocaleString()} tokens (${casing}), max_seq_length ${info.max_seq_length}`;
  if (!info.model_dir) return `No model: ${vocab} from ${info.vocab_file}. Start with --model_dir=DIR for embeddings, attention and predictions.`;
  const heads = info.heads.length ? `${info.heads.join(" + ").toUpperCase()} heads` : "no pretraining heads";
  return `Model ${info.model_dir}: ${info.layers} layers × ${info.attention_heads} heads, hidden ${info.hidden_size}, ${heads}; ${vocab}.`;
}

async function start() {
  wire();
  try {
    state.info = await api("info");
  } catch (error) {
    $("#status").textContent = error.message;
    return;
  }
  $("#status").textContent = describe(state.info);
  // Example texts in words the vocabulary holds whole (the page's own are English).
  for (const [id, text] of Object.entries(state.info.examples || {})) $(`#${id}`).value = text;
  const options = (count, prefix) => Array.from({ length: count }, (_, i) => el("option", { value: i, text: `${prefix} ${i + 1}` }));
  $("#att-layer").replaceChildren(...options(state.info.layers, "Layer"));
  $("#att-head").replaceChildren(...options(state.info.attention_heads, "Head"));
  document.body.dataset.ready = "true";
  activate(location.hash.slice(1) in REFRESH ? location.hash.slice(1) : "represent");
}

start();
