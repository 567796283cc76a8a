// The console's `console.css`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `console.css`: the style sheet: light and dark colour schemes, visible focus.
    static let css = #"""
        /* Marquee console. Light and dark follow the system (prefers-color-scheme). No inline styles: the CSP forbids them. */
        :root {
          color-scheme: light dark;
          --bg: #f7f7fb;
          --surface: #ffffff;
          --surface-2: #f0f1f6;
          --text: #1b1c22;
          --muted: #5b5f6e;
          --border: #d6d8e1;
          --accent: #4338ca;
          --accent-text: #ffffff;
          --focus: #2563eb;
          --ok: #116b3a;
          --ok-bg: #dcf5e6;
          --warn: #8a4b00;
          --warn-bg: #fdf0d5;
          --bad: #a61b1b;
          --bad-bg: #fde2e2;
          --info: #1e4f9c;
          --info-bg: #e0ebfb;
          --neutral-bg: #e9eaf0;
          --s0: #4338ca;
          --s1: #0e7c5a;
          --s2: #c2410c;
          --s3: #b91c1c;
          --s4: #7c3aed;
          --s5: #0369a1;
          --s6: #a16207;
          --s7: #6b7280;
          --radius: 8px;
          font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
          font-size: 15px;
          line-height: 1.45;
        }
        @media (prefers-color-scheme: dark) {
          :root {
            --bg: #111217;
            --surface: #1a1b22;
            --surface-2: #23252e;
            --text: #e8e9ee;
            --muted: #a2a6b5;
            --border: #363945;
            --accent: #8b93ff;
            --accent-text: #0b0c10;
            --focus: #93c5fd;
            --ok: #7ee2a8;
            --ok-bg: #143524;
            --warn: #f8c471;
            --warn-bg: #3a2a0c;
            --bad: #ff9b9b;
            --bad-bg: #4a1717;
            --info: #a5c8ff;
            --info-bg: #17294a;
            --neutral-bg: #2c2e38;
            --s0: #8b93ff;
            --s1: #4ade9b;
            --s2: #fb923c;
            --s3: #f87171;
            --s4: #c4a5ff;
            --s5: #5cc8ff;
            --s6: #facc15;
            --s7: #a1a1aa;
          }
        }
        * { box-sizing: border-box; }
        /* `hidden` wins over any display rule below (the nav is display: flex). */
        [hidden] { display: none !important; }
        body { margin: 0; background: var(--bg); color: var(--text); }
        a { color: var(--accent); }
        a:hover { text-decoration-thickness: 2px; }
        :focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; border-radius: 3px; }
        h1 { font-size: 1.5rem; margin: 0 0 0.25rem; }
        /* Headings take focus after navigation (a starting point for keyboard and screen-reader users), not a control. */
        h1:focus, h1:focus-visible { outline: none; }
        h2 { font-size: 1.1rem; margin: 0 0 0.75rem; }
        h3 { font-size: 1rem; margin: 0 0 0.5rem; }
        code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.9em; }
        .visually-hidden {
          position: absolute; width: 1px; height: 1px; padding: 0; margin: -1px; overflow: hidden;
          clip: rect(0 0 0 0); white-space: nowrap; border: 0;
        }
        .skip-link { position: absolute; left: 0.5rem; top: -3rem; background: var(--surface); padding: 0.5rem 0.75rem; z-index: 10; }
        .skip-link:focus { top: 0.5rem; }
        .top-bar {
          display: flex; align-items: center; gap: 1.25rem; flex-wrap: wrap;
          padding: 0.6rem 1.25rem; background: var(--surface); border-bottom: 1px solid var(--border);
        }
        .brand { font-weight: 700; display: inline-flex; align-items: center; gap: 0.4rem; }
        .top-bar nav { display: flex; gap: 0.25rem; flex-wrap: wrap; }
        .top-bar nav a {
          text-decoration: none; color: var(--text); padding: 0.4rem 0.7rem; border-radius: 6px;
        }
        .top-bar nav a:hover { background: var(--surface-2); }
        .top-bar nav a[aria-current="page"] { background: var(--accent); color: var(--accent-text); }
        .top-spacer { flex: 1; }
        .key-hint { color: var(--muted); font-size: 0.85rem; }
        main { padding: 1.25rem; max-width: 1200px; margin: 0 auto; }
        main:focus { outline: none; }
        .page-head { display: flex; align-items: flex-start; justify-content: space-between; gap: 1rem; flex-wrap: wrap; margin-bottom: 1rem; }
        .subtitle { color: var(--muted); margin: 0; }
        .grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 1rem; margin-bottom: 1rem; }
        .card { background: var(--surface); border: 1px solid var(--border); border-radius: var(--radius); padding: 1rem; margin-bottom: 1rem; }
        .grid .card { margin-bottom: 0; }
        .stat-list { list-style: none; margin: 0; padding: 0; }
        .stat-list li { display: flex; justify-content: space-between; gap: 1rem; padding: 0.3rem 0; border-bottom: 1px solid var(--surface-2); }
        .stat-list li:last-child { border-bottom: 0; }
        .stat-value { font-variant-numeric: tabular-nums; font-weight: 600; }
        .big-number { font-size: 2rem; font-weight: 700; font-variant-numeric: tabular-nums; }
        .muted { color: var(--muted); }
        .small { font-size: 0.85rem; }
        .badge {
          display: inline-block; padding: 0.05rem 0.5rem; border-radius: 999px; font-size: 0.8rem; font-weight: 600;
          background: var(--neutral-bg); color: var(--text); white-space: nowrap;
        }
        .badge.ok, .badge.active, .badge.sent, .badge.delivered, .badge.done { background: var(--ok-bg); color: var(--ok); }
        .badge.pending, .badge.queued, .badge.scheduled, .badge.starting, .badge.parked, .badge.ending { background: var(--info-bg); color: var(--info); }
        .badge.broken, .badge.failed, .badge.undeliverable, .badge.error { background: var(--bad-bg); color: var(--bad); }
        .badge.superseded, .badge.expired, .badge.cancelled, .badge.warning { background: var(--warn-bg); color: var(--warn); }
        table { width: 100%; border-collapse: collapse; background: var(--surface); }
        th, td { text-align: left; padding: 0.45rem 0.6rem; border-bottom: 1px solid var(--border); vertical-align: top; }
        th { font-size: 0.8rem; text-transform: uppercase; letter-spacing: 0.03em; color: var(--muted); background: var(--surface-2); }
        td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
        .table-wrap { overflow-x: auto; border: 1px solid var(--border); border-radius: var(--radius); margin-bottom: 1rem; }
        .table-wrap table { border: 0; }
        .table-wrap tr:last-child td { border-bottom: 0; }
        pre.json {
          background: var(--surface-2); border: 1px solid var(--border); border-radius: 6px; padding: 0.75rem;
          overflow: auto; max-height: 24rem; margin: 0;
        }
        form.filters { display: flex; gap: 0.75rem; flex-wrap: wrap; align-items: flex-end; margin-bottom: 1rem; }
        .field { display: flex; flex-direction: column; gap: 0.25rem; }
        .field label { font-size: 0.85rem; font-weight: 600; }
        .field .hint { font-size: 0.8rem; color: var(--muted); }
        input, select, textarea {
          font: inherit; color: var(--text); background: var(--surface); border: 1px solid var(--border);
          border-radius: 6px; padding: 0.4rem 0.55rem;
        }
        textarea { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; width: 100%; min-height: 10rem; }
        input[aria-invalid="true"], textarea[aria-invalid="true"] { border-color: var(--bad); }
        .button {
          font: inherit; font-weight: 600; cursor: pointer; border-radius: 6px; padding: 0.45rem 0.9rem;
          border: 1px solid var(--accent); background: var(--accent); color: var(--accent-text);
        }
        .button.secondary { background: transparent; color: var(--accent); }
        .button.danger { background: var(--bad); border-color: var(--bad); color: var(--surface); }
        .button:disabled { opacity: 0.55; cursor: not-allowed; }
        .actions { display: flex; gap: 0.5rem; flex-wrap: wrap; align-items: center; margin-bottom: 1rem; }
        .actions:last-child { margin-bottom: 0; }
        .pager { display: flex; gap: 0.5rem; align-items: center; justify-content: flex-end; }
        .notice { padding: 0.75rem 1rem; border-radius: var(--radius); border: 1px solid var(--border); background: var(--surface); }
        .notice.error { border-color: var(--bad); background: var(--bad-bg); color: var(--bad); }
        .notice.success { border-color: var(--ok); background: var(--ok-bg); color: var(--ok); }
        .empty { text-align: center; padding: 2rem 1rem; background: var(--surface); border: 1px dashed var(--border); border-radius: var(--radius); }
        .empty p { max-width: 40rem; margin: 0.5rem auto; }
        .empty code { background: var(--surface-2); padding: 0.1rem 0.3rem; border-radius: 4px; }
        .signin { max-width: 28rem; margin: 3rem auto; }
        .signin form { display: flex; flex-direction: column; gap: 0.75rem; }
        .signin input { width: 100%; }
        dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 0.3rem 1rem; margin: 0; }
        dl.facts dt { color: var(--muted); }
        dl.facts dd { margin: 0; overflow-wrap: anywhere; }
        .two-col { display: grid; grid-template-columns: repeat(auto-fit, minmax(320px, 1fr)); gap: 1rem; }
        .chart { width: 100%; height: auto; display: block; }
        .chart text { fill: var(--muted); font-size: 11px; font-family: inherit; }
        .chart .axis { stroke: var(--border); stroke-width: 1; }
        .chart .grid-line { stroke: var(--surface-2); stroke-width: 1; }
        .chart .line { fill: none; stroke-width: 2; }
        .chart .bar-label { fill: var(--text); font-size: 12px; }
        .chart .bar-value { fill: var(--text); font-size: 12px; font-weight: 600; }
        .s0 { stroke: var(--s0); fill: var(--s0); } .s1 { stroke: var(--s1); fill: var(--s1); }
        .s2 { stroke: var(--s2); fill: var(--s2); } .s3 { stroke: var(--s3); fill: var(--s3); }
        .s4 { stroke: var(--s4); fill: var(--s4); } .s5 { stroke: var(--s5); fill: var(--s5); }
        .s6 { stroke: var(--s6); fill: var(--s6); } .s7 { stroke: var(--s7); fill: var(--s7); }
        .chart .line.s0, .chart .line.s1, .chart .line.s2, .chart .line.s3,
        .chart .line.s4, .chart .line.s5, .chart .line.s6, .chart .line.s7 { fill: none; }
        .legend { list-style: none; display: flex; flex-wrap: wrap; gap: 0.4rem 1rem; padding: 0; margin: 0.5rem 0 0; font-size: 0.85rem; }
        .legend li { display: inline-flex; align-items: center; gap: 0.35rem; }
        .swatch { width: 0.8rem; height: 0.8rem; border-radius: 2px; display: inline-block; }
        .swatch.s0 { background: var(--s0); } .swatch.s1 { background: var(--s1); } .swatch.s2 { background: var(--s2); }
        .swatch.s3 { background: var(--s3); } .swatch.s4 { background: var(--s4); } .swatch.s5 { background: var(--s5); }
        .swatch.s6 { background: var(--s6); } .swatch.s7 { background: var(--s7); }
        details summary { cursor: pointer; color: var(--accent); margin-top: 0.5rem; }
        dialog {
          border: 1px solid var(--border); border-radius: var(--radius); background: var(--surface); color: var(--text);
          max-width: 36rem; width: calc(100% - 2rem); padding: 1.25rem;
        }
        dialog::backdrop { background: rgba(0, 0, 0, 0.45); }
        .failure-group h2 { display: flex; gap: 0.5rem; align-items: center; flex-wrap: wrap; }
        .loading { color: var(--muted); }
        @media (prefers-reduced-motion: no-preference) {
          .top-bar nav a, .button { transition: background-color 0.15s ease; }
        }
        """#
}
