// The console's `charts.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `charts.js`: the SVG line and bar charts.
    static let chartsJS = #"""
        // Charts drawn as SVG with the DOM: no library, colours from CSS classes (s0…s7) so they follow light and dark mode.
        // Each chart carries a text alternative (<title>/<desc>) and a data table behind a disclosure.
        import { h, s, formatNumber, table } from './ui.js';

        const WIDTH = 1000;
        let counter = 0;
        const uniqueID = (prefix) => `${prefix}-${(counter += 1)}`;

        /** A "nice" upper bound for an axis: 1, 2 or 5 × a power of ten, at least `max`. */
        function niceMax(max) {
          if (max <= 0) return 1;
          const power = 10 ** Math.floor(Math.log10(max));
          for (const step of [1, 2, 5, 10]) if (step * power >= max) return step * power;
          return 10 * power;
        }

        /**
         * Stacked columns over time, one column per bucket. `series`: [{ label, values: [numbers, oldest first] }];
         * `start`: the first bucket's Date; `bucketSeconds`: each value's span. Returns a figure with the SVG, a legend
         * and a table.
         */
        export function timeChart({ title, series, start, bucketSeconds }) {
          const width = 1000;
          const height = 220;
          const margin = { top: 12, right: 12, bottom: 28, left: 44 };
          const plotWidth = width - margin.left - margin.right;
          const plotHeight = height - margin.top - margin.bottom;
          const buckets = Math.max(1, ...series.map((line) => line.values.length));
          const stacked = Array.from({ length: buckets }, (_, i) => series.reduce((sum, line) => sum + (line.values[i] ?? 0), 0));
          const top = niceMax(Math.max(0, ...stacked));
          const slot = plotWidth / buckets;
          const x = (index) => margin.left + index * slot;
          const y = (value) => margin.top + plotHeight - (value / top) * plotHeight;
          const totals = series.map((line) => line.values.reduce((a, b) => a + b, 0));
          const description = series.length
            ? series.map((line, i) => `${line.label}: ${formatNumber(totals[i])}`).join('; ')
            : 'No deliveries in this period.';
          const label = (index) =>
            new Date(start.getTime() + index * bucketSeconds * 1000).toLocaleTimeString(undefined, {
              hour: '2-digit',
              minute: '2-digit',
            });

          const id = uniqueID('columns');
          const svg = s(
            'svg',
            { class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-labelledby': `${id}-t ${id}-d` },
            s('title', { id: `${id}-t`, text: title }),
            s('desc', { id: `${id}-d`, text: description }),
          );
          // Counts are whole: a half-way line only where it is a whole number.
          for (const value of [0, top / 2, top].filter(Number.isInteger)) {
            svg.append(
              s('line', { class: 'grid-line', x1: margin.left, x2: width - margin.right, y1: y(value), y2: y(value) }),
              s('text', { x: margin.left - 6, y: y(value) + 4, 'text-anchor': 'end', text: formatNumber(value) }),
            );
          }
          for (let index = 0; index < buckets; index += 1) {
            let base = 0;
            series.forEach((line, i) => {
              const value = line.values[index] ?? 0;
              if (!value) return;
              svg.append(
                s(
                  'rect',
                  { class: `s${i % 8}`, x: x(index) + 1, y: y(base + value), width: Math.max(1, slot - 2), height: y(base) - y(base + value) },
                  s('title', { text: `${label(index)} ${line.label}: ${formatNumber(value)}` }),
                ),
              );
              base += value;
            });
          }
          svg.append(s('line', { class: 'axis', x1: margin.left, x2: width - margin.right, y1: y(0), y2: y(0) }));
          svg.append(
            s('text', { x: x(0), y: height - 8, 'text-anchor': 'start', text: label(0) }),
            s('text', { x: x(Math.floor(buckets / 2)) + slot / 2, y: height - 8, 'text-anchor': 'middle', text: label(Math.floor(buckets / 2)) }),
            s('text', { x: x(buckets), y: height - 8, 'text-anchor': 'end', text: label(buckets - 1) }),
          );

          const legend = h(
            'ul',
            { class: 'legend' },
            series.map((line, i) =>
              h('li', {}, h('span', { class: `swatch s${i % 8}`, 'aria-hidden': 'true' }), `${line.label} (${formatNumber(totals[i])})`),
            ),
          );
          const rows = Array.from({ length: buckets }, (_, index) => index).filter((index) => stacked[index] > 0);
          const details = h(
            'details',
            {},
            h('summary', { text: 'Show as a table' }),
            rows.length
              ? table(
                  title,
                  [
                    { label: 'Minute', cell: (index) => label(index) },
                    ...series.map((line) => ({ label: line.label, className: 'num', cell: (index) => formatNumber(line.values[index]) })),
                  ],
                  rows,
                )
              : h('p', { class: 'muted', text: 'No deliveries in this period.' }),
          );
          return h('figure', { class: 'chart-figure' }, svg, series.length ? legend : h('p', { class: 'muted small', text: 'No deliveries in the last hour.' }), details);
        }

        /**
         * Horizontal bars in groups, e.g. a funnel per platform. `groups`: [{ label, bars: [{ label, value }] }].
         */
        export function barChart({ title, groups, testid }) {
          const barHeight = 22;
          const gap = 6;
          const groupGap = 18;
          const labelWidth = 120;
          const right = 70;
          const rowsCount = groups.reduce((n, group) => n + group.bars.length, 0);
          const height = rowsCount * (barHeight + gap) + groups.length * (groupGap + 18) + 8;
          const max = niceMax(Math.max(0, ...groups.flatMap((group) => group.bars.map((bar) => bar.value))));
          const plot = WIDTH - labelWidth - right;
          const description = groups
            .map((group) => `${group.label}: ${group.bars.map((bar) => `${bar.label} ${formatNumber(bar.value)}`).join(', ')}`)
            .join('; ');
          const id = uniqueID('bars');
          const svg = s(
            'svg',
            {
              class: 'chart',
              viewBox: `0 0 ${WIDTH} ${height}`,
              role: 'img',
              'aria-labelledby': `${id}-t ${id}-d`,
              'data-testid': testid,
            },
            s('title', { id: `${id}-t`, text: title }),
            s('desc', { id: `${id}-d`, text: description }),
          );
          let top = 4;
          for (const group of groups) {
            svg.append(s('text', { x: 0, y: top + 13, class: 'bar-label', 'font-weight': '700', text: group.label }));
            top += 18 + 4;
            group.bars.forEach((bar, i) => {
              const width = max ? (bar.value / max) * plot : 0;
              svg.append(
                s('text', { x: 0, y: top + barHeight / 2 + 4, class: 'bar-label', text: bar.label }),
                s('rect', { x: labelWidth, y: top, width: Math.max(width, bar.value ? 2 : 0), height: barHeight, rx: 3, class: `s${i % 8}` }),
                s('text', {
                  x: labelWidth + width + 6,
                  y: top + barHeight / 2 + 4,
                  class: 'bar-value',
                  'data-bar': `${group.label}/${bar.label}`,
                  text: formatNumber(bar.value),
                }),
              );
              top += barHeight + gap;
            });
            top += groupGap - gap;
          }
          return svg;
        }
        """#
}
