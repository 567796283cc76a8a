// The console's `failures.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `failures.js`: the Failures screen.
    static let failuresJS = #"""
        // Failures: the last failed and undeliverable deliveries, grouped by provider, outcome and reason.
        import { api, query, segment } from './api.js';
        import {
          h, heading, replace, setTitle, formatNumber, plural, time, badge, emptyState, errorNotice, table, every, providerName,
        } from './ui.js';

        const WINDOWS = [
          [1, 'last hour'],
          [6, 'last 6 hours'],
          [24, 'last 24 hours'],
          [72, 'last 3 days'],
          [168, 'last 7 days'],
        ];

        /**
         * What a reason means and what to do, for the reasons operators meet most. A Map, not an object: a reason is
         * whatever the provider answered, and `constructor` or `__proto__` must find nothing.
         */
        const ADVICE = new Map(Object.entries({
          BadDeviceToken: 'The token is not valid for this app and environment: check the credential’s environment (sandbox or production).',
          Unregistered: 'The app was removed from the device, or the token expired; Marquee retired the token.',
          DeviceTokenNotForTopic: 'The token belongs to another bundle ID than the APNs credential’s.',
          TopicDisallowed: 'The APNs key may not push to this bundle ID.',
          ExpiredProviderToken: 'The APNs provider token expired; Marquee refreshes it and retries.',
          UNREGISTERED: 'The FCM token is no longer valid; Marquee retired it.',
          INVALID_ARGUMENT: 'FCM refused the message or token as malformed.',
          SENDER_ID_MISMATCH: 'The FCM token belongs to another Firebase project than the service account’s.',
          credential_broken: 'The tenant’s credential is broken: upload a working key.',
          instance_expired: 'The live activity expired before its push could be sent.',
          channel_gone: 'The broadcast channel no longer exists at Apple.',
          timeout: 'The provider did not answer in time after every retry.',
          transport_error: 'The connection to the provider failed after every retry.',
          tls_error: 'The TLS connection to the provider failed: check the endpoint and CA.',
        }));

        export function renderFailures(main, params, navigate) {
          setTitle('Failures');
          // The period the address names, offered in the list when it is not one of WINDOWS (a link to the last 48
          // hours shows that, not the first choice); the API says what it accepts.
          const hours = params.get('hours') ?? '24';
          const windows = WINDOWS.map(([value, label]) => [String(value), label]);
          if (!windows.some(([value]) => value === hours)) windows.push([hours, `last ${hours} hours`]);
          const period = windows.find(([value]) => value === hours)[1];
          const select = h(
            'select',
            { id: 'failures-window', name: 'hours' },
            windows.map(([value, label]) => h('option', { value, selected: value === hours, text: label })),
          );
          select.addEventListener('change', () => navigate('failures', { hours: select.value }));
          const results = h('div', { 'aria-busy': 'true' }, h('p', { class: 'loading', text: 'Loading…' }));
          replace(
            main,
            h(
              'div',
              { class: 'page-head' },
              heading('Failures', 'Deliveries that failed or could not be delivered, grouped by what the provider said. Refreshes every 30 s.'),
              h('div', { class: 'field' }, h('label', { for: 'failures-window', text: 'Period' }), select),
            ),
            results,
          );
          const load = async () => {
            try {
              const failures = await api(`/v1/delivery_failures${query({ hours })}`);
              replace(results, view(failures, period));
            } catch (error) {
              replace(results, errorNotice(error, 'Could not load failures: '));
            }
            results.setAttribute('aria-busy', 'false');
          };
          load();
          return every(30000, load);
        }

        function view(failures, period) {
          if (failures.groups.length === 0) {
            return emptyState(
              `No failed deliveries in the ${period}`,
              'Every push in this period was sent, superseded by a newer one, or is still queued. Failures show here with the provider’s reason and links to their live activities.',
            );
          }
          return [
            h(
              'p',
              { class: 'muted' },
              `${plural(failures.total, 'failed or undeliverable delivery', 'failed or undeliverable deliveries')} in the ${period}, in ${plural(failures.groups_total, 'group')}.`,
              failures.truncated ? ' Only the newest are counted: narrow the period for exact numbers.' : '',
              failures.groups_total > failures.groups.length ? ` The ${failures.groups.length} largest groups are shown.` : '',
            ),
            failures.groups.map((group, index) =>
              h(
                'section',
                { class: 'card failure-group', 'aria-labelledby': `group-${index}`, 'data-testid': 'failure-group' },
                h(
                  'h2',
                  { id: `group-${index}` },
                  h('span', { class: 'mono', text: group.reason ?? 'no reason recorded' }),
                  badge(group.status),
                  h('span', { class: 'badge', text: providerName(group.provider) }),
                  h('span', { class: 'muted small', text: `${formatNumber(group.count)} × · last ` }),
                  time(group.last_at),
                ),
                ADVICE.has(group.reason) ? h('p', { class: 'small', 'data-testid': 'failure-advice', text: ADVICE.get(group.reason) }) : null,
                table(
                  `Latest deliveries failing with ${group.reason ?? 'no reason'}`,
                  [
                    { label: 'When', cell: (d) => time(d.at) },
                    { label: 'Live activity', cell: (d) => h('a', { href: `#/activities/${segment(d.instance_id)}`, class: 'mono', text: d.instance_id }) },
                    { label: 'Operation', cell: (d) => d.operation },
                    { label: 'HTTP', className: 'num', cell: (d) => (d.http_status ? String(d.http_status) : '—') },
                    { label: 'Delivery', cell: (d) => h('span', { class: 'mono small', text: d.delivery_id }) },
                  ],
                  group.recent,
                ),
              ),
            ),
          ];
        }
        """#
}
