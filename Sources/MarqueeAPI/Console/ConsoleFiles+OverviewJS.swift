// The console's `overview.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `overview.js`: the Overview screen.
    static let overviewJS = #"""
        // Overview: instances by state, deliveries per minute by provider and outcome, the queue, credential health.
        import { api, apiOrNull } from './api.js';
        import { timeChart } from './charts.js';
        import {
          h, heading, replace, setTitle, formatNumber, time, badge, emptyState, code, errorNotice, every, providerName,
        } from './ui.js';

        const STATES = ['pending', 'active', 'ended', 'expired', 'failed'];

        export function renderOverview(main) {
          setTitle('Overview');
          const body = h('div', { 'aria-busy': 'true' }, h('p', { class: 'loading', text: 'Loading…' }));
          const refresh = h('button', { class: 'button secondary', type: 'button', text: 'Refresh' });
          replace(
            main,
            h(
              'div',
              { class: 'page-head' },
              heading('Overview', 'The last 24 hours of live activities and the last hour of deliveries. Refreshes every 15 s.'),
              refresh,
            ),
            body,
          );
          const load = async () => {
            try {
              const [overview, apns, fcm] = await Promise.all([
                api('/v1/overview'),
                apiOrNull('/v1/credentials/apns'),
                apiOrNull('/v1/credentials/fcm'),
              ]);
              replace(body, view(overview, apns, fcm));
            } catch (error) {
              replace(body, errorNotice(error, 'Could not load the overview: '));
            }
            body.setAttribute('aria-busy', 'false');
          };
          refresh.addEventListener('click', load);
          load();
          return every(15000, load);
        }

        function view(overview, apns, fcm) {
          const instances = overview.instances;
          const deliveries = overview.deliveries;
          const nothingYet = instances.total === 0 && deliveries.series.length === 0;
          return [
            nothingYet
              ? emptyState(
                  'No live activities in the last 24 hours',
                  ['Register a device from the app with the SDK key (', code('PUT /v1/people/{id}/devices/{token}'), ' and its push-to-start token), then start an activity with ', code('POST /v1/live_notifications/start'), ' or a campaign with ', code('POST /v1/campaigns'), '.'],
                )
              : null,
            h(
              'div',
              { class: 'grid' },
              h(
                'section',
                { class: 'card', 'aria-labelledby': 'instances-h', 'data-testid': 'instances-by-state' },
                h('h2', { id: 'instances-h', text: 'Live activities by state' }),
                h('div', { class: 'big-number', 'data-testid': 'instances-total', text: formatNumber(instances.total) }),
                h('p', { class: 'muted small' }, 'started since ', time(instances.since)),
                h(
                  'ul',
                  { class: 'stat-list' },
                  STATES.map((state) =>
                    h(
                      'li',
                      {},
                      h('a', { href: `#/activities?state=${state}` }, badge(state)),
                      h('span', { class: 'stat-value', 'data-state': state, text: formatNumber(instances.by_state[state] ?? 0) }),
                    ),
                  ),
                ),
              ),
              queueCard(overview.queue),
              credentialsCard(apns, fcm),
            ),
            h(
              'section',
              { class: 'card', 'aria-labelledby': 'deliveries-h', 'data-testid': 'deliveries-chart' },
              h('h2', { id: 'deliveries-h', text: 'Deliveries per minute, last hour' }),
              h('p', { class: 'muted small', text: 'Pushes queued each minute, by provider and what became of them.' }),
              timeChart({
                title: 'Deliveries per minute by provider and outcome',
                series: deliveries.series.map((line) => ({ label: `${providerName(line.provider)} ${line.status}`, values: line.counts })),
                start: new Date(deliveries.since),
                bucketSeconds: deliveries.bucket_seconds,
              }),
            ),
          ];
        }

        function queueCard(queue) {
          const providers = Object.entries(queue.by_provider);
          return h(
            'section',
            { class: 'card', 'aria-labelledby': 'queue-h', 'data-testid': 'queue' },
            h('h2', { id: 'queue-h', text: 'Queue' }),
            h('div', { class: 'big-number', 'data-testid': 'queue-due', text: `${formatNumber(queue.due)}${queue.capped ? '+' : ''}` }),
            h('p', { class: 'muted small', text: 'pushes due now' }),
            h(
              'ul',
              { class: 'stat-list' },
              h('li', {}, h('span', { text: 'Waiting for a later attempt' }), h('span', { class: 'stat-value', text: formatNumber(queue.later) })),
              h('li', {}, h('span', { text: 'Oldest due since' }), h('span', { class: 'stat-value' }, queue.oldest_due_at ? time(queue.oldest_due_at) : 'nothing due')),
              providers.map(([provider, n]) =>
                h('li', {}, h('span', { text: `${providerName(provider)} queued` }), h('span', { class: 'stat-value', text: formatNumber(n) })),
              ),
            ),
          );
        }

        function credentialsCard(apns, fcm) {
          const row = (name, credential, describe) =>
            h(
              'li',
              { 'data-credential': name.toLowerCase() },
              h('span', {}, h('strong', { text: name }), ' ', credential ? h('span', { class: 'muted small', text: describe(credential) }) : null),
              credential ? badge(credential.status) : h('span', { class: 'badge', text: 'not set up' }),
            );
          const reasons = [
            ['APNs', apns],
            ['FCM', fcm],
          ]
            .filter(([, credential]) => credential && credential.status !== 'ok')
            .map(([name, credential]) =>
              h('p', { class: 'notice error small', role: 'status' }, `${name} is ${credential.status}: ${credential.status_reason || 'no reason recorded'}. Upload a working key to resume sending; pushes wait meanwhile.`),
            );
          return h(
            'section',
            { class: 'card', 'aria-labelledby': 'credentials-h', 'data-testid': 'credentials' },
            h('h2', { id: 'credentials-h', text: 'Credential health' }),
            h(
              'ul',
              { class: 'stat-list' },
              row('APNs', apns, (c) => `${c.bundle_id} · ${c.environment}`),
              row('FCM', fcm, (c) => c.project_id),
            ),
            reasons,
            !apns || !fcm
              ? h('p', { class: 'muted small' }, 'Upload provider keys with ', code(!apns ? 'PUT /v1/credentials/apns' : 'PUT /v1/credentials/fcm'), ' (app key) to send to ', !apns ? 'iPhones' : 'Android phones', '.')
              : null,
          );
        }
        """#
}
