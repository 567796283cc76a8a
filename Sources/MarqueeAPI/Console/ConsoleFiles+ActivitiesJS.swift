// The console's `activities.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `activities.js`: the Live activities list and instance screens.
    static let activitiesJS = #"""
        // Live activities: the filtered, cursor-paged list, and one instance with its state, targets and deliveries.
        import { api, query, segment } from './api.js';
        import {
          h, heading, replace, setTitle, formatNumber, formatTime, time, badge, emptyState, code, errorNotice, table, pretty,
          every, announce, providerName, pager,
        } from './ui.js';

        const STATES = ['pending', 'active', 'ended', 'expired', 'failed'];
        const FILTERS = ['state', 'notification_type', 'person', 'campaign'];

        export function renderActivities(main, params, navigate) {
          setTitle('Live activities');
          const filters = Object.fromEntries(FILTERS.map((name) => [name, params.get(name) ?? '']));
          const cursor = params.get('cursor') ?? '';
          const form = filterForm(filters, (values) => navigate('activities', values));
          const results = h('div', { 'aria-live': 'polite', 'aria-busy': 'true' }, h('p', { class: 'loading', text: 'Loading…' }));
          replace(main, h('div', { class: 'page-head' }, heading('Live activities', 'Newest first. Filter, then open one to see its deliveries.')), form, results);

          (async () => {
            try {
              const page = await api(`/v1/live_notifications${query({ ...filters, cursor, limit: 25 })}`);
              const filtered = FILTERS.some((name) => filters[name]);
              if (page.data.length === 0) {
                replace(
                  results,
                  filtered || cursor
                    ? emptyState('No live activities match', 'Clear a filter, or check the spelling of the activity type, person or campaign ID.')
                    : emptyState(
                        'No live activities yet',
                        ['Register a device with ', code('PUT /v1/people/{id}/devices/{token}'), ' (sdk key) and its push-to-start token, then start an activity with ', code('POST /v1/live_notifications/start'), ' (app key).'],
                      ),
                );
              } else {
                replace(
                  results,
                  listTable(page.data),
                  pager(`activities${query(filters)}`, cursor, page.next_cursor, (to) => navigate('activities', { ...filters, cursor: to })),
                );
                announce(`${page.data.length} live activities shown`);
              }
            } catch (error) {
              replace(results, errorNotice(error, 'Could not load live activities: '));
            }
            results.setAttribute('aria-busy', 'false');
          })();
          return () => {};
        }

        function filterForm(values, submit) {
          const input = (name, label, hint, list) =>
            h(
              'div',
              { class: 'field' },
              h('label', { for: `filter-${name}`, text: label }),
              h('input', { id: `filter-${name}`, name, value: values[name], placeholder: hint, autocomplete: 'off', spellcheck: 'false', list }),
            );
          // The tenant's first 200 activity types as suggestions for that field (typing any identifier still works).
          const types = h('datalist', { id: 'activity-types' });
          api('/v1/activity_types?limit=200')
            .then((body) => replace(types, (body.activity_types ?? []).map((t) => h('option', { value: t.identifier }))))
            .catch(() => {});
          const form = h(
            'form',
            { class: 'filters', role: 'search', 'aria-label': 'Filter live activities' },
            h(
              'div',
              { class: 'field' },
              h('label', { for: 'filter-state', text: 'State' }),
              h(
                'select',
                { id: 'filter-state', name: 'state' },
                h('option', { value: '', text: 'Any state' }),
                STATES.map((state) => h('option', { value: state, selected: values.state === state, text: state })),
              ),
            ),
            input('notification_type', 'Activity type', 'com.example.delivery', 'activity-types'),
            types,
            input('person', 'Person ID', 'user-42'),
            input('campaign', 'Campaign ID', 'match-day'),
            h('div', { class: 'actions' }, h('button', { class: 'button', type: 'submit', text: 'Apply filters' }), h('button', { class: 'button secondary', type: 'reset', text: 'Clear' })),
          );
          form.addEventListener('submit', (event) => {
            event.preventDefault();
            const data = new FormData(form);
            submit(Object.fromEntries(FILTERS.map((name) => [name, String(data.get(name) ?? '').trim()])));
          });
          form.addEventListener('reset', (event) => {
            event.preventDefault();
            submit({});
          });
          return form;
        }

        function listTable(items) {
          return table(
            'Live activities',
            [
              { label: 'Instance', cell: (i) => h('a', { href: `#/activities/${segment(i.instance_id)}`, class: 'mono', text: i.instance_id }) },
              { label: 'State', cell: (i) => badge(i.state) },
              { label: 'Activity type', cell: (i) => h('span', { class: 'mono small', text: i.notification_type }) },
              { label: 'Person', cell: (i) => i.person?.id ?? '—' },
              { label: 'Version', className: 'num', cell: (i) => formatNumber(i.version) },
              { label: 'Campaign', cell: (i) => (i.campaign_id ? h('a', { href: `#/campaigns/${segment(i.campaign_id)}`, text: i.campaign_id }) : '—') },
              { label: 'Started', cell: (i) => time(i.started_at) },
            ],
            items,
            { 'data-testid': 'activities-table' },
          );
        }

        // MARK: one instance

        export function renderActivity(main, id) {
          setTitle(`Live activity ${id}`);
          const body = h('div', { 'aria-busy': 'true' }, h('p', { class: 'loading', text: 'Loading…' }));
          const status = h('p', { class: 'muted small', 'data-testid': 'refresh-status' });
          replace(main, h('p', {}, h('a', { href: '#/activities', text: '← All live activities' })), h('div', { class: 'page-head' }, heading(id, status)), body);
          let stop = () => {};
          const deliveriesPage = (cursor) => api(`/v1/live_notifications/${segment(id)}/deliveries${query({ limit: 50, cursor })}`);
          // Deliveries loaded with "Load older deliveries": they follow the delivery `after` (newest first), and `older`
          // is the cursor of the next older page.
          let olderPages = [];
          let after = null;
          let older = null;

          /**
           * The newest page and the deliveries between it and the older ones held, read up to two pages on; null when
           * more than that came in since (the older ones are then let go). Without it, new deliveries pushed the newest
           * page's window forward and those it no longer covered were shown nowhere.
           */
          const join = async (newest) => {
            const items = newest.data.slice();
            let cursor = newest.next_cursor;
            for (let pages = 0; ; pages += 1) {
              const at = items.findIndex((d) => d.id === after);
              if (at >= 0) return items.slice(0, at + 1);
              if (!cursor || pages === 2) return null;
              const page = await deliveriesPage(cursor);
              items.push(...page.data);
              cursor = page.next_cursor;
            }
          };

          const refresh = async () => {
            try {
              const [instance, deliveries] = await Promise.all([api(`/v1/live_notifications/${segment(id)}`), deliveriesPage()]);
              if (olderPages.length > 0) {
                const joined = await join(deliveries);
                if (joined) {
                  olderPages = joined.slice(deliveries.data.length).concat(olderPages);
                  after = deliveries.data.at(-1)?.id ?? null;
                } else {
                  olderPages = [];
                }
              }
              if (olderPages.length === 0) {
                older = deliveries.next_cursor;
                after = deliveries.data.at(-1)?.id ?? null;
              }
              const fresh = new Set(deliveries.data.map((d) => d.id));
              const shown = deliveries.data.concat(olderPages.filter((d) => !fresh.has(d.id)));
              const open = instance.state === 'pending' || instance.state === 'active';
              replace(body, instanceView(instance, shown, older, loadOlder));
              status.textContent = open
                ? `Refreshing every 5 s while ${instance.state}. Last checked ${new Date().toLocaleTimeString()}.`
                : `This live activity is ${instance.state}; it no longer changes.`;
              if (!open) stop();
            } catch (error) {
              // Only a live activity that is not there stops the refreshing; anything else may pass.
              if (error.status === 404) {
                replace(body, emptyState('No such live activity', 'It may have been erased, or purged after the retention period.'));
                status.textContent = '';
                stop();
              } else {
                replace(body, errorNotice(error, 'Could not load the live activity: '));
                status.textContent = `Could not refresh at ${new Date().toLocaleTimeString()}; trying again every 5 s.`;
              }
            }
            body.setAttribute('aria-busy', 'false');
          };
          // One refresh or older page at a time, in order: each reads and sets what the other does.
          let queue = Promise.resolve();
          const serially = (task) => (queue = queue.then(task));
          const load = () => serially(refresh);
          const loadOlder = (button) => {
            button.disabled = true;
            return serially(async () => {
              try {
                const page = await deliveriesPage(older);
                olderPages = olderPages.concat(page.data);
                older = page.next_cursor;
                await refresh();
                announce(`${page.data.length} older deliveries loaded`);
              } catch (error) {
                button.replaceWith(errorNotice(error));
              }
            });
          };
          load();
          stop = every(5000, load);
          return () => stop();
        }

        function instanceView(instance, deliveries, older, loadOlder) {
          const facts = [
            ['State', badge(instance.state)],
            ['Activity type', h('span', { class: 'mono', text: instance.notification_type })],
            ['Person', instance.person?.id ? h('a', { href: `#/activities?person=${encodeURIComponent(instance.person.id)}`, text: instance.person.id }) : '—'],
            ['Version', h('span', { 'data-testid': 'instance-version', text: String(instance.version) })],
            ['Campaign', instance.campaign_id ? h('a', { href: `#/campaigns/${segment(instance.campaign_id)}`, text: instance.campaign_id }) : '—'],
            ['Started', formatTime(instance.started_at)],
            ['Updated', formatTime(instance.updated_at)],
            ['Expires', formatTime(instance.expires_at)],
            ['Ended', formatTime(instance.ended_at)],
            ['High-priority pushes, last hour', String(instance.high_priority_pushes_last_hour ?? 0)],
          ];
          if (instance.failure_reason) facts.splice(1, 0, ['Failure', instance.failure_reason]);
          const moreButton = older ? h('button', { class: 'button secondary', type: 'button', text: 'Load older deliveries' }) : null;
          moreButton?.addEventListener('click', () => loadOlder(moreButton));
          return [
            h(
              'div',
              { class: 'two-col' },
              h('section', { class: 'card', 'aria-labelledby': 'facts-h' }, h('h2', { id: 'facts-h', text: 'Summary' }), h('dl', { class: 'facts' }, facts.map(([term, value]) => [h('dt', { text: term }), h('dd', {}, value)]))),
              h(
                'section',
                { class: 'card', 'aria-labelledby': 'state-h' },
                h('h2', { id: 'state-h', text: `Content state (version ${instance.version})` }),
                h('pre', { class: 'json', 'data-testid': 'content-state', tabindex: '0', text: pretty(instance.content_state) }),
                h('details', {}, h('summary', { text: 'Attributes' }), h('pre', { class: 'json', tabindex: '0', text: pretty(instance.attributes) })),
              ),
            ),
            h(
              'section',
              { class: 'card', 'aria-labelledby': 'targets-h' },
              h('h2', { id: 'targets-h', text: 'Targets' }),
              instance.targets.length
                ? table('Targets', [
                    { label: 'Device', cell: (t) => h('span', { class: 'mono', text: t.device_token }) },
                    { label: 'Platform', cell: (t) => t.platform },
                    { label: 'Token kind', cell: (t) => t.token_kind.replace(/_/g, ' ') },
                    { label: 'Token', cell: (t) => h('span', { class: 'mono', text: t.token }) },
                  ], instance.targets)
                : h('p', { class: 'muted' }, instance.state === 'pending' ? 'No activity token yet: the device reports one once the activity has started on it.' : 'No activity token is registered for this live activity.'),
            ),
            h(
              'section',
              { class: 'card', 'aria-labelledby': 'deliveries-h' },
              h('h2', { id: 'deliveries-h', text: 'Deliveries, newest first' }),
              deliveries.length
                ? table(
                    'Deliveries',
                    [
                      { label: 'Created', cell: (d) => time(d.created_at) },
                      { label: 'Operation', cell: (d) => `${d.operation} (v${d.instance_version})` },
                      { label: 'Provider', cell: (d) => `${providerName(d.provider)} · ${d.token_kind.replace(/_/g, ' ')}` },
                      { label: 'Device', cell: (d) => h('span', { class: 'mono small', text: d.device_token }) },
                      { label: 'Status', cell: (d) => badge(d.status) },
                      { label: 'Attempts', className: 'num', cell: (d) => String(d.attempts) },
                      { label: 'Provider answer', cell: (d) => providerAnswer(d) },
                      { label: 'Sent', cell: (d) => time(d.sent_at) },
                    ],
                    deliveries,
                    { 'data-testid': 'deliveries-table' },
                  )
                : emptyState('No deliveries yet', 'This live activity has no device to push to: its person has no registered device with a push-to-start or FCM token.'),
              moreButton,
            ),
          ];
        }

        function providerAnswer(d) {
          const parts = [];
          if (d.http_status) parts.push(`HTTP ${d.http_status}`);
          if (d.reason) parts.push(d.reason);
          const text = parts.join(' · ') || (d.status === 'queued' ? `next attempt ${new Date(d.next_attempt_at).toLocaleTimeString()}` : '—');
          return h('span', {}, text, d.provider_id ? h('div', { class: 'muted small mono', title: 'Provider ID', text: d.provider_id }) : null);
        }
        """#
}
