// layerscope's page, part 1 of 4: where answers come from, and how the DOM is built.
// Every name that comes from a run (modules, runs, messages) reaches the DOM as text: through
// textContent or text nodes, never innerHTML, and through escape() where Plotly draws it
// (Plotly reads a few HTML tags in its labels).
"use strict";

window.layerscope = (function () {
  const embedded = document.getElementById("layerscope-data");
  // The report's answers, under the URLs the page would ask a server for; null when served.
  const REPORT = embedded ? JSON.parse(embedded.textContent) : null;

  function apiPath(path, params) {
    const keys = Object.keys(params || {}).filter((k) => params[k] !== null && params[k] !== undefined).sort();
    const query = keys.map((k) => encodeURIComponent(k) + "=" + encodeURIComponent(params[k])).join("&");
    return "api/" + path + (query ? "?" + query : "");
  }

  // Answers asked for in one round (an opening, a poll) are asked once: the same URL shares
  // one request. A new round forgets them, so a running run's answers are asked anew.
  let asked = new Map();

  function api(path, params) {
    const url = apiPath(path, params);
    if (!asked.has(url)) asked.set(url, request(url));
    return asked.get(url);
  }

  function newRound() {
    asked = new Map();
  }

  async function request(url) {
    if (REPORT) {
      if (Object.prototype.hasOwnProperty.call(REPORT.responses, url)) return REPORT.responses[url];
      const missing = new Error("not in this report: " + url);
      missing.missing = true;
      throw missing;
    }
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    noteSkipped(body.skipped);
    return body;
  }

  // The files the answers shown were read without (damaged, copies), file -> reason: a view
  // says so beside what it shows. Forgotten at each navigation.
  const skipped = new Map();
  let onSkipped = null;

  function noteSkipped(entries) {
    if (!Array.isArray(entries)) return;
    let added = false;
    for (const entry of entries) {
      if (entry && !skipped.has(entry.file)) {
        skipped.set(String(entry.file), String(entry.reason));
        added = true;
      }
    }
    if (added && onSkipped) onSkipped(skipped);
  }

  // Call ``listener`` with the files skipped now (if any) and whenever an answer adds one;
  // null forgets them and stops calling.
  function watchSkipped(listener) {
    if (listener === null) skipped.clear();
    onSkipped = listener;
    if (listener && skipped.size) listener(skipped);
  }

  function runPath(id, rest) {
    return "runs/" + encodeURIComponent(id) + (rest ? "/" + rest : "");
  }

  // A packed float32 array (see _encode.py) as rows of numbers, null where NaN.
  function unpack(packed) {
    const binary = atob(packed.base64);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const flat = new Float32Array(bytes.buffer);
    const rows = packed.shape.length === 2 ? packed.shape[0] : 1;
    const columns = packed.shape.length === 2 ? packed.shape[1] : packed.shape[0];
    const out = [];
    for (let r = 0; r < rows; r++) {
      const row = new Array(columns);
      for (let c = 0; c < columns; c++) {
        const v = flat[r * columns + c];
        row[c] = Number.isNaN(v) ? null : v;
      }
      out.push(row);
    }
    return out;
  }

  // The page's DOM, once parsed; the served page also waits there for Plotly (a deferred
  // script after this one), whose parsing the first requests overlap.
  const domReady = new Promise((resolve) => {
    const check = () => {
      if (document.readyState !== "loading" && window.Plotly) resolve();
    };
    document.addEventListener("DOMContentLoaded", check);
    window.addEventListener("load", check);
    check();
  });

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (value === null || value === undefined) continue;
      if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "class") node.className = value;
      else node.setAttribute(key, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function select(id, options, value, onchange, labels) {
    const node = el("select", { id: id, onchange: (event) => onchange(event.target.value) });
    for (const option of options) {
      const item = el("option", { value: option }, labels ? labels(option) : option);
      if (String(option) === String(value)) item.selected = true;
      node.append(item);
    }
    return node;
  }

  function label(text, control) {
    return el("label", {}, text + " ", control);
  }

  function replace(id, ...children) {
    const node = document.getElementById(id);
    if (!node) return null;
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
    return node;
  }

  // For Plotly's labels and hover text: its own markup is read from <...>, so escape it.
  function escape(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function layerName(name) {
    return name === "" ? "(root)" : name;
  }

  function number(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en");
    return Math.abs(value) >= 1e4 || Math.abs(value) < 1e-3 ? value.toExponential(3) : value.toPrecision(4);
  }

  function time(seconds) {
    return seconds ? new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–";
  }

  function showError(id, error) {
    replace(id, el("p", { class: error.missing ? "note" : "error" }, error.message));
  }

  return { REPORT, api, newRound, runPath, unpack, domReady, el, select, label, replace, escape, layerName,
           number, time, showError, watchSkipped };
})();
