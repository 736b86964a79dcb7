// The cellium service map: follows /api/events (Server-Sent Events, one
// "graph" event per snapshot of /api/graph) and draws the snapshot with
// inline SVG. Everything from the server is set as text, never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COL_WIDTH = 240, ROW_HEIGHT = 80, TOP = 50, LEFT = 30, RADIUS = 16;

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}

function text(parent, x, y, s, cls) {
  const t = el("text", { x, y, class: cls || "" }, parent);
  t.textContent = s;
  return t;
}

// Columns: one per namespace (sorted), reserved identities last.
function layout(nodes) {
  const groups = new Map();
  for (const n of nodes) {
    const g = n.namespace || "(reserved)";
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(n);
  }
  const names = [...groups.keys()].sort((a, b) =>
    (a === "(reserved)") - (b === "(reserved)") || a.localeCompare(b));
  const pos = new Map();
  let rows = 0;
  names.forEach((g, i) => {
    groups.get(g).sort((a, b) => a.name.localeCompare(b.name)).forEach((n, j) => {
      pos.set(n.id, { x: LEFT + i * COL_WIDTH + COL_WIDTH / 2, y: TOP + 30 + j * ROW_HEIGHT + RADIUS });
      rows = Math.max(rows, j + 1);
    });
  });
  return { names, groups, pos, rows };
}

function edgeTitle(e) {
  const lines = [e.id];
  lines.push("last verdict: " + e.lastVerdict + (e.lastVerdict === "DROPPED" && e.lastDropReason ? " (" + e.lastDropReason + ")" : ""));
  lines.push("flows: " + e.forwarded + " forwarded, " + e.dropped + " dropped" + (e.other ? ", " + e.other + " other" : ""));
  if (e.dropped && e.lastDropReason) lines.push("last drop: " + e.lastDropReason + " at " + e.lastDrop);
  lines.push("port: " + (e.port ? e.port + "/" : "") + (e.protocol || "no layer 4"));
  if (e.deniedBy && e.deniedBy.length) lines.push("denied by: " + e.deniedBy.join(", "));
  if (e.allowedBy && e.allowedBy.length) lines.push("allowed by: " + e.allowedBy.join(", "));
  lines.push("last seen: " + e.lastSeen);
  return lines.join("\n");
}

// The path of an edge: a quadratic curve bent sideways so that edges
// between the same two nodes (other ports, the other direction) do not
// overlap; a loop for a node's traffic to itself.
function edgePath(a, b, k) {
  if (a === b) {
    const r = 18 + 8 * k;
    return `M ${a.x - 6} ${a.y - RADIUS} C ${a.x - r * 2} ${a.y - RADIUS - r * 2}, ${a.x + r * 2} ${a.y - RADIUS - r * 2}, ${a.x + 6} ${a.y - RADIUS}`;
  }
  const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
  const nx = -dy / len, ny = dx / len, bend = 20 + 18 * k;
  const cx = (a.x + b.x) / 2 + nx * bend, cy = (a.y + b.y) / 2 + ny * bend;
  const trim = (p, q, r) => { const l = Math.hypot(q.x - p.x, q.y - p.y) || 1; return { x: p.x + (q.x - p.x) * r / l, y: p.y + (q.y - p.y) * r / l }; };
  const s = trim(a, { x: cx, y: cy }, RADIUS), t = trim(b, { x: cx, y: cy }, RADIUS + 2);
  return `M ${s.x} ${s.y} Q ${cx} ${cy} ${t.x} ${t.y}`;
}

function showTooltip(ev, s) {
  const tip = document.getElementById("tooltip");
  tip.textContent = s;
  tip.hidden = false;
  tip.style.left = (ev.clientX + 12) + "px";
  tip.style.top = (ev.clientY + 12) + "px";
}

function hideTooltip() { document.getElementById("tooltip").hidden = true; }

function draw(snap) {
  const svg = document.getElementById("map");
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const defs = el("defs", {}, svg);
  for (const st of ["dropped", "forwarded", "idle"]) {
    const m = el("marker", { id: "arrow-" + st, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 10, markerHeight: 10, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" }, defs);
    el("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow-" + st }, m);
  }
  const { names, groups, pos, rows } = layout(snap.nodes);
  svg.setAttribute("width", Math.max(400, LEFT * 2 + names.length * COL_WIDTH));
  svg.setAttribute("height", Math.max(200, TOP + 60 + rows * ROW_HEIGHT));
  document.getElementById("empty").hidden = snap.nodes.length > 0;
  names.forEach((g, i) => {
    const x = LEFT + i * COL_WIDTH;
    el("rect", { x: x + 8, y: TOP - 10, width: COL_WIDTH - 16, height: 40 + groups.get(g).length * ROW_HEIGHT, rx: 8, class: "ns-box", "data-namespace": g }, svg);
    text(svg, x + 18, TOP + 8, g, "ns-label");
  });
  // Edges below the nodes.
  const pairs = new Map();
  const edges = el("g", { class: "edges" }, svg);
  for (const e of snap.edges) {
    const a = pos.get(e.source), b = pos.get(e.destination);
    if (!a || !b) continue;
    const pair = [e.source, e.destination].sort().join("\u0000");
    const k = pairs.get(pair) || 0;
    pairs.set(pair, k + 1);
    const p = el("path", {
      d: edgePath(a, b, e.source < e.destination || e.source === e.destination ? k : k + 0.5),
      class: "edge " + e.state, "marker-end": "url(#arrow-" + e.state + ")",
      "data-edge-id": e.id, "data-source": e.source, "data-destination": e.destination, "data-state": e.state,
      "stroke-width": Math.min(6, 1.5 + Math.log10(1 + e.forwarded + e.dropped + e.other)),
    }, edges);
    const title = edgeTitle(e);
    el("title", {}, p).textContent = title;
    p.addEventListener("mousemove", ev => showTooltip(ev, title));
    p.addEventListener("mouseleave", hideTooltip);
  }
  for (const n of snap.nodes) {
    const q = pos.get(n.id);
    const g = el("g", { class: "node " + (n.kind === "reserved" ? "reserved" : "workload"), "data-node-id": n.id }, svg);
    el("circle", { cx: q.x, cy: q.y, r: RADIUS }, g);
    text(g, q.x, q.y + RADIUS + 14, n.name, "node-label");
    el("title", {}, g).textContent = n.id + " (" + n.kind + (n.identity ? ", identity " + n.identity : "") + ")";
  }
}

function showUpstream(u) {
  const s = document.getElementById("upstream");
  s.className = "upstream " + u.state;
  s.dataset.state = u.state;
  let msg = "relay " + u.address + ": " + u.state;
  if (u.state === "connected" && u.connectedNodes) msg += " (" + u.connectedNodes + " nodes)";
  if (u.state === "disconnected") {
    if (u.error) msg += ": " + u.error;
    if (u.retryAt) msg += "; retrying at " + new Date(u.retryAt).toLocaleTimeString();
  }
  s.textContent = msg;
}

function showStats(snap) {
  const st = snap.stats;
  document.getElementById("stats").textContent =
    snap.nodes.length + " workloads, " + snap.edges.length + " edges (at most " + st.maxEdges + ", idle ones go after " + st.idleTimeout + "); " +
    st.flows + " flows" + (st.lost ? ", " + st.lost + " lost" : "") + (st.evicted ? ", " + st.evicted + " edges evicted" : "");
}

function start() {
  const page = document.getElementById("page");
  const src = new EventSource("api/events");
  src.addEventListener("graph", ev => {
    const snap = JSON.parse(ev.data);
    page.textContent = "";
    page.className = "page";
    document.body.dataset.version = snap.version;
    showUpstream(snap.upstream);
    showStats(snap);
    draw(snap);
  });
  src.onerror = () => {
    page.textContent = "lost the service map server; reconnecting…";
    page.className = "page lost";
  };
}

start();
