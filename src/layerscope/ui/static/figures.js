// layerscope's page, part 2 of 4: each answer of the API as a Plotly figure ({data, layout}).
// Pure functions: they read their arguments only, and escape every name they draw.
"use strict";

window.layerscope.figures = (function () {
  const { unpack, escape, layerName } = window.layerscope;
  const ALERT_COLOURS = { error: "#c0392b", warning: "#e67e22" };
  const ZERO_COLOUR = "#e377c2";      // cells and bars of exact zeros where a log has no place
  const NOT_DRAWN_COLOUR = "#c0392b"; // markers of values a log axis cannot draw
  const BAR_COLOUR = "#3b7dd8";
  const OPEN_SLOT_COLOUR = "#95a5a6"; // a linear histogram's underflow and overflow bars

  function markStep(step) {
    if (step === null || step === undefined) return [];
    return [{ type: "line", xref: "x", yref: "paper", x0: step, x1: step, y0: 0, y1: 1, line: { color: "#e74c3c", width: 1 } }];
  }

  function alertLines(alerts) {
    return alerts.map((alert) => ({ type: "line", xref: "x", yref: "paper", x0: alert.step, x1: alert.step, y0: 0, y1: 1,
      line: { color: ALERT_COLOURS[alert.severity] || ALERT_COLOURS.warning, width: 1, dash: "dot" } }));
  }

  // Scalars over steps, each on an axis of its own titled with its name (a learning rate's
  // schedule and a loss's fall each on the scale where its changes show), the loss first; a
  // compared run's dotted beside the same name; alerts marked across all of them.
  function scalars(own, alerts, other, otherName, revision) {
    const names = Array.from(new Set([...Object.keys(own.scalars), ...Object.keys(other ? other.scalars : {})]));
    if (!names.length) return null;
    names.sort((a, b) => (a === "loss" ? -1 : b === "loss" ? 1 : a < b ? -1 : a > b ? 1 : 0));
    const axis = (index) => (index === 0 ? "y" : "y" + (index + 1));
    const data = [];
    names.forEach((name, index) => {
      const mine = own.scalars[name], theirs = other ? other.scalars[name] : undefined;
      if (mine) data.push({ x: mine.steps, y: mine.values, name: escape(name), mode: "lines", type: "scatter", yaxis: axis(index) });
      if (theirs) data.push({ x: theirs.steps, y: theirs.values, name: escape(name + " (" + otherName + ")"), mode: "lines",
                              type: "scatter", line: { dash: "dot" }, yaxis: axis(index) });
    });
    const rows = names.length, gap = rows > 1 ? 0.06 / rows : 0;
    const layout = { margin: { t: 10, r: 20, b: 40, l: 70 }, height: 60 + 130 * rows, uirevision: revision,
      xaxis: { title: { text: "step" }, anchor: axis(rows - 1) }, shapes: alertLines(alerts), legend: { orientation: "h" } };
    names.forEach((name, index) => {
      const top = 1 - index / rows, bottom = 1 - (index + 1) / rows;
      layout["yaxis" + (index === 0 ? "" : index + 1)] = { title: { text: escape(name) }, domain: [bottom + gap, top - gap],
        anchor: "x" };
    });
    if (alerts.length) {
      const overlay = "y" + (rows + 1);
      data.push({ x: alerts.map((a) => a.step), y: alerts.map(() => 1), yaxis: overlay, mode: "markers", type: "scatter",
        name: "alerts", marker: { symbol: "triangle-down", size: 9, color: ALERT_COLOURS.error },
        text: alerts.map((a) => escape(a.rule + " " + layerName(a.module))), hovertemplate: "step %{x}<br>%{text}<extra></extra>" });
      layout["yaxis" + (rows + 1)] = { overlaying: "y", range: [0, 1.05], visible: false, fixedrange: true };
    }
    return { data, layout };
  }

  // What a heat map colours each cell by: log10 of a magnitude (null where there is none to
  // take, 0 among them), else the value itself.
  function drawnValues(answer) {
    const raw = unpack(answer.values);
    const z = answer.log_scale ? raw.map((row) => row.map((v) => (v !== null && v > 0 ? Math.log10(v) : null))) : raw;
    return { raw, z };
  }

  // The cells of a log-scale heat map that hold an exact 0 (0, else null), which a log cannot
  // colour; null where there is none, or the scale is not a log.
  function zeroCells(answer, raw) {
    if (!answer.log_scale) return null;
    const zeros = raw.map((row) => row.map((v) => (v !== null && v <= 0 ? 0 : null)));
    return zeros.some((row) => row.some((v) => v !== null)) ? zeros : null;
  }

  // What heat maps drawn side by side share so that their rows line up: the most layers of
  // any, and whether any has exact zeros (a legend).
  function sharedShape(answers) {
    return { rows: Math.max(...answers.map((answer) => answer.layers.length)),
             legend: answers.some((answer) => zeroCells(answer, unpack(answer.values)) !== null) };
  }

  // The smallest and largest coloured value of heat maps drawn side by side: one scale for all.
  function sharedRange(answers) {
    let lo = Infinity, hi = -Infinity;
    for (const answer of answers) {
      for (const row of drawnValues(answer).z) {
        for (const v of row) {
          if (v !== null && Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
        }
      }
    }
    return lo <= hi ? [lo, hi] : null;
  }

  // Layers (rows, escaped names) by columns of steps; magnitudes on a log10 colour scale. An
  // exact 0 of a magnitude has no log: its cells get a colour of their own, in the legend, so
  // that only cells without a reading stay blank. ``range``: the colour scale's [min, max]; a
  // fraction's is 0 to 1.
  function heatmap(answer, title, step, revision, range, shape) {
    if (answer.fraction && !answer.log_scale) range = [0, 1];
    const { raw, z } = drawnValues(answer);
    const log = answer.log_scale;
    const names = answer.layers.map((name) => escape(layerName(name)));
    const types = answer.layers.map((_, row) => escape((answer.types || [])[row] || "?"));
    const text = raw.map((row, index) => row.map(() => types[index]));
    const columns = answer.downsampled ? ` (a column of ${answer.width} steps, ${answer.aggregate})` : "";
    const hovertemplate = "%{y} (%{text})<br>step %{x}" + columns + "<br>" + escape(answer.stat) +
      " %{customdata:.4g}<extra></extra>";
    const trace = { type: "heatmap", x: answer.steps, y: names, z: z, customdata: raw, text: text, colorscale: "Viridis",
      hovertemplate: hovertemplate, colorbar: { title: { text: (log ? "log10 " : "") + escape(answer.stat) } },
      hoverongaps: false };
    if (range) Object.assign(trace, { zmin: range[0], zmax: range[1], zauto: false });
    const data = [trace];
    const zeros = zeroCells(answer, raw);
    if (zeros) {
      data.push({ type: "heatmap", x: answer.steps, y: names, z: zeros, customdata: raw, text: text,
        colorscale: [[0, ZERO_COLOUR], [1, ZERO_COLOUR]], showscale: false, hovertemplate: hovertemplate,
        hoverongaps: false, name: "0" });
      data.push(legendSwatch(ZERO_COLOUR, "0 (no log10)"));
    }
    // The legend (the colour of zeros) below the axis' title, where no title or row name is:
    // 60 px below the plot, in the plot's height. Maps side by side share ``shape`` (their most
    // rows, whether one has the legend): the same layers then sit in the same rows.
    const legend = shape ? shape.legend : data.length > 1;
    const bottom = legend ? 100 : 40;
    const rows = shape ? shape.rows : names.length;
    const height = Math.max(320, Math.min(900, 16 * rows + 120)) + (legend ? 50 : 0);
    const layout = { margin: { t: 30, r: 10, b: bottom, l: 120 }, height,
      uirevision: revision, title: { text: escape(title), font: { size: 13 } }, xaxis: { title: { text: "step" } },
      yaxis: { type: "category", autorange: "reversed", automargin: true }, shapes: markStep(step),
      showlegend: legend,
      legend: { orientation: "h", x: 0, y: -60 / (height - 30 - bottom), yanchor: "top", xanchor: "left" } };
    return { data: data, layout, names };
  }

  // Attention heads: red where a head's attention collapses onto one key (entropy fraction
  // 0), through yellow, to blue where it is spread evenly (1): ColorBrewer's RdYlBu.
  const COLLAPSE_SCALE = [[0, "#d73027"], [0.25, "#fc8d59"], [0.5, "#ffffbf"], [0.75, "#91bfdb"], [1, "#4575b4"]];
  const HEAD_ROW_PX = 16, MODULE_GAP_PX = 34;

  // Each attention module's heads (rows, "call:head" where it attends several times a pass)
  // by columns of steps, stacked top to bottom on one step axis and one colour scale, 0 to 1.
  function attention(answer, revision) {
    const rows = answer.modules.map((m) => m.heads.length);
    const height = rows.reduce((sum, n) => sum + n * HEAD_ROW_PX + MODULE_GAP_PX, 0);
    const columns = answer.downsampled ? ` (a column of ${answer.width} steps, its ${answer.aggregate})` : "";
    const data = [], annotations = [], layout = {};
    let top = 0;
    answer.modules.forEach((m, index) => {
      const several = new Set(m.calls).size > 1;
      const labels = m.heads.map((head, row) => (several ? m.calls[row] + ":" + head : String(head)));
      const axis = index ? "y" + (index + 1) : "y";
      const name = escape(layerName(m.module));
      const upper = 1 - (top + MODULE_GAP_PX) / height;
      top += rows[index] * HEAD_ROW_PX + MODULE_GAP_PX;
      layout["yaxis" + (index ? index + 1 : "")] = { domain: [1 - top / height, upper], type: "category",
        autorange: "reversed", anchor: "x", title: { text: several ? "call:head" : "head", font: { size: 11 } } };
      annotations.push({ text: name + (m.type ? " (" + escape(m.type) + ")" : ""), xref: "paper", yref: "paper",
        x: 0, y: upper, xanchor: "left", yanchor: "bottom", showarrow: false, font: { size: 12 } });
      data.push({ type: "heatmap", x: answer.steps, y: labels, z: unpack(m.values), yaxis: axis, zmin: 0, zmax: 1,
        colorscale: COLLAPSE_SCALE, showscale: index === 0, hoverongaps: false,
        colorbar: { title: { text: "entropy fraction" }, len: Math.min(1, 300 / height), y: 1, yanchor: "top" },
        hovertemplate: name + " head %{y}<br>step %{x}" + columns + "<br>entropy fraction %{z:.3f}<extra></extra>" });
    });
    const bottom = answer.modules.length > 1 ? "y" + answer.modules.length : "y";
    Object.assign(layout, { margin: { t: 10, r: 10, b: 40, l: 60 }, height: height + 60, uirevision: revision,
      xaxis: { title: { text: "step" }, anchor: bottom }, annotations });
    return { data, layout };
  }

  // A legend entry and nothing drawn: the colour of cells that a colour bar cannot show.
  function legendSwatch(colour, name) {
    return { type: "scatter", mode: "markers", x: [null], y: [null], name: escape(name), hoverinfo: "skip",
             marker: { symbol: "square", size: 12, color: colour } };
  }

  // A log axis labelled at powers of ten only, over whole decades from ``lo`` to ``hi`` (> 0),
  // all in one format: decimals where every decade reads short (0.001 to 10000), else 1eN.
  // Its minor ticks point inside, clear of the labels.
  function decadeAxis(lo, hi) {
    const first = Math.floor(Math.log10(lo));
    const last = Math.max(Math.ceil(Math.log10(hi)), first + 1);
    const plain = first >= -3 && last <= 4;
    const tickvals = [], ticktext = [];
    for (let power = first; power <= last; power++) {
      tickvals.push(Math.pow(10, power));
      ticktext.push(plain ? String(Math.pow(10, power).toFixed(Math.max(0, -power))) : "1e" + power);
    }
    return { type: "log", range: [first, last], tickmode: "array", tickvals, ticktext,
             minor: { ticks: "inside", ticklen: 3, dtick: "D1", showgrid: false } };
  }

  // Points of a series a log axis cannot draw (<= 0): markers on the axis' bottom edge.
  function unloggable(steps, values, name, colour) {
    const x = [], shown = [];
    values.forEach((v, index) => {
      if (v !== null && v <= 0) { x.push(steps[index]); shown.push(v); }
    });
    if (!x.length) return null;
    return { x, y: x.map(() => 0), customdata: shown, yaxis: "y2", type: "scatter", mode: "markers", cliponaxis: false,
      name: escape(name) + " ≤ 0", marker: { symbol: "triangle-up", size: 8, color: colour },
      hovertemplate: "step %{x}<br>%{customdata:.4g}: not drawn on a log axis<extra></extra>" };
  }

  // One statistic of one layer over steps, beside the compared run's; its alerts marked. On a
  // log axis, values <= 0 are marked at the bottom and counted in the title, not left out.
  function series(own, other, stat, alerts, options) {
    const values = unpack(own.stats[stat])[0];
    const otherValues = other && other.stats[stat] ? unpack(other.stats[stat])[0] : null;
    const data = [{ x: own.steps, y: values, mode: "lines+markers", type: "scatter", marker: { size: 3 },
      name: escape(options.name) }];
    if (otherValues) {
      data.push({ x: other.steps, y: otherValues, mode: "lines", type: "scatter", line: { dash: "dot" },
                  name: escape(options.otherName) });
    }
    const positive = values.concat(otherValues || []).filter((v) => v !== null && v > 0);
    const logged = options.logScale && positive.length > 0;
    const how = own.downsampled ? ` (${own.aggregates[stat]} over ${own.width} steps)` : "";
    let title = stat + how;
    let yaxis = { type: "linear" };
    if (logged) {
      yaxis = decadeAxis(Math.min(...positive), Math.max(...positive));
      const marks = [unloggable(own.steps, values, options.name, NOT_DRAWN_COLOUR),
        otherValues ? unloggable(other.steps, otherValues, options.otherName, "#7f8c8d") : null].filter(Boolean);
      const count = marks.reduce((sum, mark) => sum + mark.x.length, 0);
      if (count) title += ` · ${count} value${count === 1 ? "" : "s"} ≤ 0 not drawn on log axis (▲)`;
      data.push(...marks);
    }
    const layout = { margin: { t: 30, r: 10, b: 40, l: 60 }, height: 300, uirevision: options.revision,
      title: { text: escape(title), font: { size: 13 } }, xaxis: { title: { text: "step" } },
      yaxis, yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
      shapes: markStep(options.step).concat(alertLines(alerts)), showlegend: data.length > 1 };
    return { data, layout };
  }

  // A linear histogram's value axis: a few edges from lo to hi, and each open slot's band named.
  // The open slots' names ("< lo", "≥ hi") at their bands' middles, which say lo and hi, and
  // up to 5 of the edges between, spread evenly from the first to the last: no label beside
  // the band's own.
  function valueTicks(answer) {
    const bounds = answer.bounds;
    const inner = bounds.slice(2, -2);
    const shown = Math.min(inner.length, 5);
    const tickvals = [(bounds[0] + bounds[1]) / 2], ticktext = [answer.open_slots[0]];
    for (let k = 0; k < shown; k++) {
      const edge = inner[shown === 1 ? 0 : Math.round((k * (inner.length - 1)) / (shown - 1))];
      tickvals.push(edge);
      ticktext.push(String(Number(edge.toPrecision(4)) + 0));
    }
    tickvals.push((bounds[bounds.length - 2] + bounds[bounds.length - 1]) / 2);
    ticktext.push(answer.open_slots[1]);
    return { tickmode: "array", tickvals, ticktext };
  }

  // What each slot of a linear histogram holds: "< lo", "[a, b)", "≥ hi".
  function linearSlotNames(answer) {
    const bounds = answer.bounds;
    return bounds.slice(0, -1).map((lower, index) => {
      if (index === 0) return answer.open_slots[0];
      if (index === bounds.length - 2) return answer.open_slots[1];
      return `[${Number(lower.toPrecision(4))}, ${Number(bounds[index + 1].toPrecision(4))})`;
    });
  }

  // The "color_dim" picture: slots by steps, colour log10(1 + count). Log2 magnitude slots, or
  // a linear histogram's slots in value units (its open slots as bands beyond lo and hi).
  function colorDim(answer, step, revision) {
    const linear = answer.scale === "linear";
    let counts = unpack(answer.counts), names, y;
    if (linear) {
      names = linearSlotNames(answer).map((name) => "value " + escape(name));
      y = answer.bounds;
    } else {
      // Exact zeros (and subnormals) and Inf/NaN are slots of their own, below and above the
      // magnitudes, as the distribution draws them.
      counts = [answer.zeros, ...counts, answer.infinite];
      y = ["0", ...answer.exponents.map(String), "Inf/NaN"];
      names = ["0 or subnormal", ...answer.exponents.map((e) => `|x| in [2^${e}, 2^${e + 1})`), "Inf or NaN"];
    }
    // A count of 0 is no colour: log10(1 + 0) is a colour of the scale, and where nothing else
    // varies the autoscaled range puts it mid-scale.
    const z = counts.map((row) => row.map((v) => (v === null || !(v > 0) ? null : Math.log10(1 + v))));
    const trace = { type: "heatmap", x: answer.steps, y: y, z: z, customdata: counts, zmin: 0, zauto: false,
      text: counts.map((row, index) => row.map(() => names[index])), colorscale: "Viridis",
      colorbar: { title: { text: "log10(1+count)" } }, hoverongaps: false,
      hovertemplate: "step %{x}<br>%{text}<br>count %{customdata:.4g}<extra></extra>" };
    const top = z.reduce((most, row) => row.reduce((m, v) => (v !== null && v > m ? v : m), most), 0);
    trace.zmax = top > 0 ? top : 1;
    const how = answer.downsampled ? `, mean of ${answer.width} steps` : "";
    const what = linear ? "linear value slots; NaN not counted" : "log2 |value| slots";
    const layout = { margin: { t: 30, r: 10, b: 40, l: 60 }, height: 260, uirevision: revision,
      title: { text: "histogram over steps (" + what + how + ")", font: { size: 13 } },
      xaxis: { title: { text: "step" } },
      yaxis: Object.assign({ title: { text: linear ? "value" : "log2 |value|" } },
        linear ? valueTicks(answer) : { type: "category", categoryorder: "array", categoryarray: y }),
      shapes: markStep(step) };
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
    const shown = { step: first === last ? String(first) : `${first}–${last} (mean)`, scale: answer.scale,
                    fractions: counts.map((v) => v / total) };
    if (answer.scale === "linear") return Object.assign(shown, { bounds: answer.bounds, open_slots: answer.open_slots });
    return Object.assign(shown, { exponents: answer.exponents, zeros: (answer.zeros[column] || 0) / total,
                                  infinite: (answer.infinite[column] || 0) / total });
  }

  // Fractions of the elements in each slot at one step. A log2 histogram's exact zeros (and
  // subnormals) are a bar "0" and its Inf/NaN one "Inf/NaN", beside the magnitude slots.
  function distribution(shown) {
    const linear = shown.scale === "linear";
    const trace = linear ? linearBars(shown) : log2Bars(shown);
    const nothing = shown.fractions.some((f) => f > 0) || shown.zeros || shown.infinite ? "" : " · nothing counted";
    // The axes make room for their labels (a log2 slot's, turned, is long): none under a title.
    const layout = { margin: { t: 30, r: 10, b: 40, l: 50 }, height: 320,
      title: { text: "step " + escape(shown.step) + nothing, font: { size: 13 } },
      xaxis: Object.assign({ automargin: true }, linear
        ? Object.assign({ title: { text: "value (NaN not counted)", standoff: 8 } }, valueTicks(shown))
        : { title: { text: "|value| (log2 slots)", standoff: 8 }, type: "category" }),
      yaxis: { title: { text: "fraction" } } };
    return { data: [trace], layout };
  }

  function log2Bars(shown) {
    const x = shown.exponents.map((exponent) => "2^" + exponent);
    const text = shown.exponents.map((exponent) => `|x| in [2^${exponent}, 2^${exponent + 1})`);
    const y = shown.fractions.slice();
    if (shown.zeros) { x.unshift("0"); y.unshift(shown.zeros); text.unshift("zero (or subnormal)"); }
    if (shown.infinite) { x.push("Inf/NaN"); y.push(shown.infinite); text.push("Inf or NaN"); }
    return { type: "bar", x, y, text, textposition: "none", marker: { color: x.map((k) => ({ "0": ZERO_COLOUR, "Inf/NaN": NOT_DRAWN_COLOUR })[k] || BAR_COLOUR) },
             hovertemplate: "%{text}<br>fraction %{y:.4g}<extra></extra>" };
  }

  function linearBars(shown) {
    const bounds = shown.bounds;
    const x = bounds.slice(0, -1).map((lower, index) => (lower + bounds[index + 1]) / 2);
    const width = bounds.slice(0, -1).map((lower, index) => bounds[index + 1] - lower);
    const open = x.map((_, index) => index === 0 || index === x.length - 1);
    return { type: "bar", x, y: shown.fractions, width, text: linearSlotNames(shown).map(escape), textposition: "none",
             marker: { color: open.map((edge) => (edge ? OPEN_SLOT_COLOUR : BAR_COLOUR)) },
             hovertemplate: "value %{text}<br>fraction %{y:.4g}<extra></extra>" };
  }

  return { markStep, scalars, sharedRange, sharedShape, heatmap, attention, series, decadeAxis, colorDim, columnDistribution,
           distribution };
})();
