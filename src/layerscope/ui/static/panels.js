// layerscope's page, part 3 of 4: the tables and the module tree, built from answers as DOM.
// Every value goes in as a text node (el() never parses HTML).
"use strict";

window.layerscope.panels = (function () {
  const { el, layerName, number, time } = window.layerscope;
  const ALERTS_SHOWN = 3; // alerts of each rule shown above its fold

  function table(id, headings, rows) {
    const head = el("tr", {}, headings.map((h) => el("th", {}, h)));
    return el("table", { id: id }, el("thead", {}, head), el("tbody", {}, rows));
  }

  // Runs of one name in different folders are told apart by their folder, beside the name.
  function runs(listed) {
    if (!listed.length) return el("p", { class: "note" }, "no runs here yet");
    const named = new Map();
    for (const run of listed) named.set(run.name || run.id, (named.get(run.name || run.id) || 0) + 1);
    const folder = (run) => (named.get(run.name || run.id) > 1 ? el("span", { class: "run-id" }, " " + run.id) : null);
    return table("runs-table", ["run", "status", "steps", "ranks", "started", "alerts"], listed.map((run) =>
      run.status === "unreadable" ? unreadableRun(run) : el("tr", { class: "run-row" },
        el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(run.id) }, run.name || run.id), folder(run),
          partial(run.skipped)),
        el("td", {}, el("span", { class: "status " + run.status }, run.status || "–")),
        el("td", { class: "num" }, number(run.steps)),
        el("td", { class: "num" }, number(run.ranks)),
        el("td", {}, time(run.started)),
        el("td", { class: "num" + (run.alerts ? " alerting" : "") }, number(run.alerts)))));
  }

  // A run read without some of its files: its counts lack them; which and why on hover.
  function partial(skipped) {
    if (!skipped || !skipped.length) return null;
    const files = skipped.map((entry) => entry.file + ": " + entry.reason).join("\n");
    return el("span", { class: "partial", title: files }, " files left out");
  }

  // A run whose run.json cannot be read: its folder and why, and no link into it.
  function unreadableRun(run) {
    return el("tr", { class: "run-row unreadable" },
      el("td", {}, el("span", { class: "run-id" }, run.id)),
      el("td", {}, el("span", { class: "status unreadable" }, "unreadable")),
      el("td", { colspan: 4, class: "error reason" }, run.error || "its run.json cannot be read"));
  }

  // The files the answers shown were read without, each with why: what is shown lacks them.
  function skipped(files) {
    if (!files.size) return [];
    return [el("h2", {}, "Files left out"),
      el("p", { class: "note" }, "These files of the run cannot be read and were left out: the views below lack their rows."),
      el("ul", { class: "skipped-files" }, Array.from(files, ([file, reason]) =>
        el("li", {}, el("code", {}, file), ": ", el("span", { class: "reason" }, reason))))];
  }

  function seconds(value, unit, unknown) {
    return value === null || value === undefined ? unknown : number(value) + " " + unit;
  }

  // layerscope's own cost, as the run recorded it; each rank's progress when there are several.
  // While the run is written, what run.json does not carry yet is "not yet known", never 0.
  function overhead(o) {
    const unknown = o.live ? "not yet known" : "–";
    const facts = [
      ["training thread", seconds(o.cost_seconds, "s", unknown)],
      ["per step", seconds(o.cost_ms_per_step, "ms", unknown)],
      ["writer thread", seconds(o.writer_seconds, "s", o.live ? "not yet known (noted at close)" : "–")],
      ["steps", number(o.steps)],
      ["statistics kernel", o.kernel || unknown],
      ["rows recorded", number(o.recorded_rows)],
      ["rows dropped", number(o.dropped_rows)],
      ["failures", number(o.failures)],
    ];
    const rows = facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "num" }, v)));
    const ranks = (o.ranks || []).length > 1
      ? o.ranks.map((r) => el("tr", {}, el("th", {}, "rank " + r.rank),
        el("td", {}, (r.status || "–") + ", " + number(r.steps) + " steps, " + (r.host || ""))))
      : [];
    return [el("table", { class: "facts" }, rows), ranks.length ? el("table", { class: "facts" }, ranks) : null];
  }

  // Alerts by rule and severity, in order of each one's first step: a count, where and when,
  // the first few alerts, and the rest folded, so that a hundred alerts stay a short panel.
  function alerts(listed, onPick) {
    if (!listed.length) return el("p", { class: "note" }, "no alerts");
    const groups = new Map();
    for (const alert of listed) {
      const key = alert.rule + "\u0000" + alert.severity;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(alert);
    }
    return el("div", { id: "alert-groups" }, Array.from(groups.values(), (group) => alertGroup(group, onPick)));
  }

  function alertGroup(group, onPick) {
    const { rule, severity } = group[0];
    const layers = new Set(group.map((alert) => alert.module)).size;
    const steps = group.map((alert) => alert.step);
    const span = Math.min(...steps) === Math.max(...steps) ? "step " + steps[0] : `steps ${Math.min(...steps)}–${Math.max(...steps)}`;
    const rest = group.slice(ALERTS_SHOWN);
    return el("div", { class: "alert-group" },
      el("h3", { class: "alert-summary " + (severity || "") }, el("span", { class: "rule" }, rule), " · ", severity || "–",
        " · ", counted(group.length, "alert"), " in ", counted(layers, "layer"), ", ", span),
      alertTable(group.slice(0, ALERTS_SHOWN), onPick),
      rest.length ? el("details", { class: "more-alerts" }, el("summary", {}, `${counted(rest.length, "more alert")} of ${rule}`),
        alertTable(rest, onPick)) : null);
  }

  function counted(count, noun) {
    return number(count) + " " + noun + (count === 1 ? "" : "s");
  }

  function alertTable(listed, onPick) {
    const head = el("tr", {}, ["step", "rule", "module", "kind", "tensor", "message"].map((h) => el("th", {}, h)));
    return el("table", { class: "alerts-table" }, el("thead", {}, head), el("tbody", {}, listed.map((alert) =>
      el("tr", { class: "alert-row " + (alert.severity || ""), title: "show this layer at this step", onclick: () => onPick(alert) },
        el("td", { class: "num" }, alert.step), el("td", {}, alert.rule), el("td", {}, layerName(alert.module)), el("td", {}, alert.kind),
        el("td", {}, alert.tensor), el("td", {}, alert.message)))));
  }

  // The layers of two compared runs that are not in both: a layer is the same one where its
  // name and its module type both match.
  function unmatched(own, other, ownName, otherName) {
    const keys = (answer) => new Set(answer.layers.map((name, row) => name + "\u0000" + answer.types[row]));
    const alone = (answer, others) => answer.layers
      .map((name, row) => [name, answer.types[row]])
      .filter(([name, type]) => !others.has(name + "\u0000" + type))
      .map(([name, type]) => layerName(name) + " (" + type + ")");
    const left = alone(own, keys(other)), right = alone(other, keys(own));
    if (!left.length && !right.length) return [];
    const side = (name, list) => (list.length ? [el("b", {}, name), ": " + list.join(", ") + ". "] : []);
    return ["Not in both runs (layers matched by name and module type), not overlaid: ",
      ...side(ownName, left), ...side(otherName, right)];
  }

  // The module tree: names, types, parameter shapes and counts; a watched one opens its layer.
  function modules(listed, onPick) {
    const byName = new Map(listed.map((m) => [m.name, m]));
    const item = (module) => {
      const shapes = Object.entries(module.parameters).map(([k, shape]) => k + " (" + shape.join(", ") + ")").join(", ");
      const pick = (event) => {
        event.preventDefault();
        if (module.watched) onPick(module.name);
      };
      const line = el("div", { class: "module" + (module.watched ? " watched" : "") },
        el("a", { href: "#", class: "module-name", onclick: pick }, layerName(module.name)),
        " ", el("span", { class: "type" }, module.type),
        shapes ? el("span", { class: "shapes" }, " " + shapes) : null,
        el("span", { class: "count" }, " " + number(module.num_parameters_total) + " parameters"));
      const children = module.children.map((name) => byName.get(name)).filter(Boolean);
      return el("li", {}, line, children.length ? el("ul", {}, children.map(item)) : null);
    };
    const childNames = new Set(listed.flatMap((m) => m.children));
    return el("ul", { class: "tree" }, listed.filter((m) => !childNames.has(m.name)).map(item));
  }

  function runFacts(summary) {
    return [el("span", { class: "run-name" }, summary.name || summary.id),
      el("span", { class: "status " + summary.status }, summary.status),
      el("span", { id: "run-steps" }, number(summary.steps) + " steps"),
      el("span", { class: "note" }, "started " + time(summary.started))];
  }

  // The run view's sections, empty: each is filled by its own render as its answer comes.
  function runView() {
    return [
      el("section", { id: "run-head", class: "panel" }, el("span", { id: "run-facts" }), el("span", { id: "compare-slot" })),
      el("section", { id: "skipped", class: "panel notice", hidden: "" }),
      el("div", { class: "row" },
        el("section", { class: "panel wide" }, el("h2", {}, "Scalars"), el("div", { id: "scalars", class: "chart" })),
        el("section", { class: "panel narrow" }, el("h2", {}, "Overhead"), el("div", { id: "overhead" }))),
      el("section", { class: "panel" }, el("h2", {}, "Layers by steps"), el("div", { id: "heatmap-controls", class: "controls" }),
        el("div", { class: "heatmaps" }, el("div", { id: "heatmap", class: "chart tall" }),
          el("div", { id: "heatmap-compare", class: "chart tall" })),
        el("p", { id: "heatmap-note", class: "note" }), el("p", { id: "heatmap-unmatched", class: "note" })),
      el("section", { id: "attention-panel", class: "panel", hidden: "" }, el("h2", {}, "Attention heads by steps"),
        el("div", { id: "attention", class: "chart" }), el("p", { id: "attention-note", class: "note" })),
      el("section", { id: "layer-panel", class: "panel" }, el("h2", {}, "Layer ", el("span", { id: "layer-name" }, "–"),
        " ", el("span", { id: "layer-type", class: "type" }), " ", el("span", { id: "layer-step", class: "note" })),
        el("div", { id: "series-controls", class: "controls" }),
        el("div", { class: "row" }, el("div", { id: "series", class: "chart wide" }), el("div", { id: "distribution", class: "chart narrow" })),
        el("div", { id: "colordim", class: "chart" })),
      el("section", { class: "panel" }, el("h2", {}, "Alerts"), el("div", { id: "alerts" })),
      el("section", { class: "panel" }, el("h2", {}, "Modules"), el("div", { id: "modules" }))];
  }

  return { runs, skipped, overhead, alerts, unmatched, modules, runFacts, runView };
})();
