// layerscope's page, part 2 of 4: each answer of the API as a Plotly figure ({data, layout}).
// Pure functions: they read their arguments only, and escape every name they draw.
"use strict";

window.layerscope.figures = (function () {
  const { unpack, escape, layerName } = window.layerscope;
  const ALERT_COLOURS = { error: "#c0392b", warning: "#e67e22" };

  function markStep(step) {
    if (step === null || step === undefined) return [];
    return [{ type: "line", xref: "x", yref: "paper", x0: step, x1: step, y0: 0, y1: 1, line: { color: "#e74c3c", width: 1 } }];
  }

  function alertLines(alerts) {
    return alerts.map((alert) => ({ type: "line", xref: "x", yref: "paper", x0: alert.step, x1: alert.step, y0: 0, y1: 1,
      line: { color: ALERT_COLOURS[alert.severity] || ALERT_COLOURS.warning, width: 1, dash: "dot" } }));
  }

  // Scalars over steps (loss on the left axis, the others on the right), alerts marked.
  function scalars(own, alerts, other, otherName, revision) {
    const data = [];
    for (const [name, series] of Object.entries(own.scalars)) {
      data.push({ x: series.steps, y: series.values, name: escape(name), mode: "lines", type: "scatter",
                  yaxis: name === "loss" || data.length === 0 ? "y" : "y2" });
    }
    for (const [name, series] of Object.entries(other ? other.scalars : {})) {
      data.push({ x: series.steps, y: series.values, name: escape(name + " (" + otherName + ")"), mode: "lines",
                  type: "scatter", line: { dash: "dot" }, yaxis: name === "loss" ? "y" : "y2" });
    }
    if (!data.length) return null;
    if (alerts.length) {
      data.push({ x: alerts.map((a) => a.step), y: alerts.map(() => 1), yaxis: "y3", mode: "markers", type: "scatter",
        name: "alerts", marker: { symbol: "triangle-down", size: 9, color: ALERT_COLOURS.error },
        text: alerts.map((a) => escape(a.rule + " " + layerName(a.module))), hovertemplate: "step %{x}<br>%{text}<extra></extra>" });
    }
    const layout = { margin: { t: 10, r: 50, b: 40, l: 60 }, height: 280, uirevision: revision,
      xaxis: { title: { text: "step" } }, yaxis: { title: { text: "loss" } },
      yaxis2: { overlaying: "y", side: "right", showgrid: false },
      yaxis3: { overlaying: "y", range: [0, 1.05], visible: false, fixedrange: true },
      shapes: alertLines(alerts), legend: { orientation: "h" } };
    return { data, layout };
  }

  // Layers (rows, escaped names) by columns of steps; magnitudes on a log10 colour scale.
  function heatmap(answer, title, step, revision) {
    const raw = unpack(answer.values);
    const log = answer.log_scale;
    const z = log ? raw.map((row) => row.map((v) => (v !== null && v > 0 ? Math.log10(v) : null))) : raw;
    const names = answer.layers.map((name) => escape(layerName(name)));
    const columns = answer.downsampled ? ` (a column of ${answer.width} steps, ${answer.aggregate})` : "";
    const trace = { type: "heatmap", x: answer.steps, y: names, z: z, customdata: raw, colorscale: "Viridis",
      hovertemplate: "%{y}<br>step %{x}" + columns + "<br>" + escape(answer.stat) + " %{customdata:.4g}<extra></extra>",
      colorbar: { title: { text: (log ? "log10 " : "") + escape(answer.stat) } }, hoverongaps: false };
    const layout = { margin: { t: 30, r: 10, b: 40, l: 120 }, height: Math.max(320, Math.min(900, 16 * names.length + 120)),
      uirevision: revision, title: { text: escape(title), font: { size: 13 } }, xaxis: { title: { text: "step" } },
      yaxis: { type: "category", autorange: "reversed", automargin: true }, shapes: markStep(step) };
    return { data: [trace], layout, names };
  }

  // One statistic of one layer over steps, beside the compared run's; its alerts marked.
  function series(own, other, stat, alerts, options) {
    const values = unpack(own.stats[stat])[0];
    const data = [{ x: own.steps, y: values, mode: "lines+markers", type: "scatter", marker: { size: 3 },
      name: escape(options.name) }];
    if (other && other.stats[stat]) {
      data.push({ x: other.steps, y: unpack(other.stats[stat])[0], mode: "lines", type: "scatter", line: { dash: "dot" },
                  name: escape(options.otherName) });
    }
    const logged = options.logScale && values.some((v) => v !== null && v > 0);
    const how = own.downsampled ? ` (${own.aggregates[stat]} over ${own.width} steps)` : "";
    const layout = { margin: { t: 30, r: 10, b: 40, l: 60 }, height: 300, uirevision: options.revision,
      title: { text: escape(stat + how), font: { size: 13 } }, xaxis: { title: { text: "step" } },
      yaxis: { type: logged ? "log" : "linear" }, shapes: markStep(options.step).concat(alertLines(alerts)),
      showlegend: Boolean(other) };
    return { data, layout };
  }

  // The "color_dim" picture: log2 magnitude slots by steps, colour log10(1 + count).
  function colorDim(answer, step, revision) {
    const counts = unpack(answer.counts);
    const z = counts.map((row) => row.map((v) => (v === null ? null : Math.log10(1 + v))));
    const trace = { type: "heatmap", x: answer.steps, y: answer.exponents, z: z, customdata: counts, colorscale: "Viridis",
      hovertemplate: "step %{x}<br>|x| in [2^%{y}, 2^(%{y}+1))<br>count %{customdata:.4g}<extra></extra>",
      colorbar: { title: { text: "log10(1+count)" } } };
    const how = answer.downsampled ? `, mean of ${answer.width} steps` : "";
    const layout = { margin: { t: 30, r: 10, b: 40, l: 60 }, height: 260, uirevision: revision,
      title: { text: "histogram over steps (log2 |value| slots" + how + ")", font: { size: 13 } },
      xaxis: { title: { text: "step" } }, yaxis: { title: { text: "log2 |value|" } }, shapes: markStep(step) };
    return { data: [trace], layout };
  }

  // A distribution from the column of a color_dim answer that holds ``step`` (the report's).
  function columnDistribution(answer, step) {
    if (!answer.steps.length) return null;
    let column = answer.steps.length - 1;
    for (let c = 0; c < answer.steps.length; c++) {
      if (answer.last_steps[c] >= step) { column = c; break; }
    }
    const counts = unpack(answer.counts).map((row) => row[column] || 0);
    const total = answer.totals[column] || 1;
    const first = answer.steps[column], last = answer.last_steps[column];
    return { step: first === last ? String(first) : `${first}–${last} (mean)`, exponents: answer.exponents,
             fractions: counts.map((v) => v / total), zeros: (answer.zeros[column] || 0) / total };
  }

  // Fractions of the elements in each log2 magnitude slot at one step.
  function distribution(shown) {
    const trace = { type: "bar", x: shown.exponents, y: shown.fractions, marker: { color: "#3b7dd8" },
      hovertemplate: "|x| in [2^%{x}, 2^(%{x}+1))<br>fraction %{y:.4g}<extra></extra>" };
    const zeros = shown.zeros ? ` · zeros ${(100 * shown.zeros).toFixed(1)}%` : "";
    const nothing = shown.fractions.some((f) => f > 0) || shown.zeros ? "" : " · no finite value";
    const layout = { margin: { t: 30, r: 10, b: 40, l: 50 }, height: 300,
      title: { text: "step " + escape(shown.step) + zeros + nothing, font: { size: 13 } },
      xaxis: { title: { text: "log2 |value|" } }, yaxis: { title: { text: "fraction" } } };
    return { data: [trace], layout };
  }

  return { markStep, scalars, heatmap, series, colorDim, columnDistribution, distribution };
})();
