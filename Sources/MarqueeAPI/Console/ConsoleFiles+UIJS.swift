// The console's `ui.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `ui.js`: DOM builders, formatting, empty states and problems.
    static let uiJS = #"""
        // Small DOM helpers shared by the screens: element builders, formatting, empty states and errors.

        /**
         * Creates an element. `attributes`: `class`, `text`, `on<event>` handlers, `dataset` (an object), boolean
         * attributes as true/false, anything else as an attribute. Children: nodes, strings, arrays, null (skipped).
         */
        export function h(tag, attributes = {}, ...children) {
          const element = document.createElement(tag);
          applyAttributes(element, attributes);
          append(element, children);
          return element;
        }

        const SVG = 'http://www.w3.org/2000/svg';

        /** Creates an SVG element (attributes as for `h`). */
        export function s(tag, attributes = {}, ...children) {
          const element = document.createElementNS(SVG, tag);
          applyAttributes(element, attributes);
          append(element, children);
          return element;
        }

        function applyAttributes(element, attributes) {
          for (const [name, value] of Object.entries(attributes)) {
            if (value === undefined || value === null || value === false) continue;
            if (name === 'text') element.textContent = String(value);
            else if (name === 'dataset') Object.assign(element.dataset, value);
            else if (name.startsWith('on') && typeof value === 'function') element.addEventListener(name.slice(2), value);
            else element.setAttribute(name, value === true ? '' : String(value));
          }
        }

        function append(element, children) {
          for (const child of children.flat(Infinity)) {
            if (child === undefined || child === null || child === false) continue;
            element.append(child instanceof Node ? child : document.createTextNode(String(child)));
          }
        }

        /** Replaces everything in `element` with `children`. */
        export function replace(element, ...children) {
          element.replaceChildren();
          append(element, children);
        }

        /** Says `message` to screen readers. */
        export function announce(message) {
          const region = document.getElementById('announcer');
          if (region) region.textContent = message;
        }

        export function setTitle(title) {
          document.title = `${title} · Marquee console`;
        }

        const numberFormat = new Intl.NumberFormat();
        export const formatNumber = (n) => numberFormat.format(n ?? 0);

        /** `apns` → APNs, `fcm` → FCM. */
        export const providerName = (provider) => ({ apns: 'APNs', fcm: 'FCM' })[provider] ?? String(provider).toUpperCase();

        /** "1 group", "3 groups". */
        export const plural = (n, one, many = `${one}s`) => `${formatNumber(n)} ${n === 1 ? one : many}`;

        const timeFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });

        /** A date-time in the browser's time zone, or an em dash. */
        export function formatTime(iso) {
          if (!iso) return '—';
          const date = new Date(iso);
          return Number.isNaN(date.getTime()) ? String(iso) : timeFormat.format(date);
        }

        /** "3 min ago", "in 2 h". */
        export function formatRelative(iso, now = Date.now()) {
          if (!iso) return '—';
          const seconds = Math.round((new Date(iso).getTime() - now) / 1000);
          const magnitude = Math.abs(seconds);
          let text;
          if (magnitude < 60) text = `${magnitude} s`;
          else if (magnitude < 3600) text = `${Math.round(magnitude / 60)} min`;
          else if (magnitude < 86400) text = `${Math.round(magnitude / 3600)} h`;
          else text = `${Math.round(magnitude / 86400)} d`;
          return seconds <= 0 ? `${text} ago` : `in ${text}`;
        }

        /** A <time> element showing the relative time, with the absolute one as its title. */
        export function time(iso) {
          if (!iso) return h('span', { class: 'muted', text: '—' });
          return h('time', { datetime: iso, title: formatTime(iso), text: formatRelative(iso) });
        }

        export function pretty(value) {
          return JSON.stringify(value, null, 2);
        }

        /** A status pill; its class picks the colour, its text says the state (colour is never the only cue). */
        export function badge(status) {
          const text = status ?? 'unknown';
          return h('span', { class: `badge ${String(text).replace(/[^a-z_]/g, '')}`, text: text.replace(/_/g, ' ') });
        }

        /** An empty state: what is missing and what to do next. */
        export function emptyState(title, ...lines) {
          return h('div', { class: 'empty', role: 'status' }, h('h2', { text: title }), lines.map((line) => h('p', {}, line)));
        }

        /** Inline code. */
        export const code = (text) => h('code', { text });

        /** A problem shown to the operator: the server's detail, and the field it names. */
        export function errorNotice(error, prefix = '') {
          const problem = (error && error.problem) || {};
          const detail = problem.detail || problem.title || (error && error.message) || 'Something went wrong.';
          const field = problem.field ? ` (field: ${problem.field})` : '';
          return h('div', { class: 'notice error', role: 'alert' }, `${prefix}${detail}${field}`);
        }

        /** A table: `columns` are [{ label, className?, cell(row) }]. */
        export function table(caption, columns, rows, attributes = {}) {
          return h(
            'div',
            { class: 'table-wrap' },
            h(
              'table',
              attributes,
              h('caption', { class: 'visually-hidden', text: caption }),
              h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.className, text: c.label })))),
              h('tbody', {}, rows.map((row) => h('tr', {}, columns.map((c) => h('td', { class: c.className }, c.cell(row)))))),
            ),
          );
        }

        /** The page heading, focused after navigation so keyboard and screen-reader users start at the top. */
        export function heading(text, subtitle) {
          return h(
            'div',
            {},
            h('h1', { tabindex: '-1', text }),
            subtitle ? h('p', { class: 'subtitle' }, subtitle) : null,
          );
        }

        /** The cursor of the page before each page, by list and that page's cursor (see `pager`). */
        const previousCursors = new Map();

        /**
         * "← Previous page" and "Next page →" of a list paged with the API's cursors (null when it has one page).
         * `list` names the list with its filters, `cursor` is this page's ('' for the first), `next` the following
         * page's, `go(cursor)` shows a page. The page before a page is remembered by that page's cursor, not in a
         * stack: after the browser's Back or Forward, "Previous page" still goes to the page before the one shown. A
         * page opened otherwise (a reload, a link) goes back to the first page.
         */
        export function pager(list, cursor, next, go) {
          if (!cursor && !next) return null;
          const previous = h('button', { class: 'button secondary', type: 'button', text: '← Previous page', disabled: !cursor });
          previous.addEventListener('click', () => go(previousCursors.get(`${list} ${cursor}`) ?? ''));
          const following = h('button', { class: 'button secondary', type: 'button', text: 'Next page →', disabled: !next });
          following.addEventListener('click', () => {
            previousCursors.set(`${list} ${next}`, cursor);
            go(next);
          });
          return h('nav', { class: 'pager', 'aria-label': 'Pages' }, previous, following);
        }

        /** Runs `task` every `ms` while the page is visible; returns a function that stops it. */
        export function every(ms, task) {
          let timer = null;
          let running = false;
          const tick = async () => {
            if (running || document.hidden) return;
            running = true;
            try {
              await task();
            } finally {
              running = false;
            }
          };
          timer = setInterval(tick, ms);
          const onVisible = () => {
            if (!document.hidden) tick();
          };
          document.addEventListener('visibilitychange', onVisible);
          return () => {
            clearInterval(timer);
            document.removeEventListener('visibilitychange', onVisible);
          };
        }
        """#
}
