// The console's `campaigns.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `campaigns.js`: the Campaigns list and campaign screens, with campaign-wide update and end.
    static let campaignsJS = #"""
        // Campaigns: the list, and one campaign with its funnel, schedules, and campaign-wide update and end.
        import { api, query, segment } from './api.js';
        import { barChart } from './charts.js';
        import {
          h, heading, replace, setTitle, formatNumber, formatTime, time, badge, emptyState, code, errorNotice, table, pretty,
          every, announce, plural, pager,
        } from './ui.js';

        export function renderCampaigns(main, params, navigate) {
          setTitle('Campaigns');
          const cursor = params.get('cursor') ?? '';
          const results = h('div', { 'aria-busy': 'true' }, h('p', { class: 'loading', text: 'Loading…' }));
          replace(main, h('div', { class: 'page-head' }, heading('Campaigns', 'Newest first. Open one for its funnel, schedules and campaign-wide changes.')), results);
          (async () => {
            try {
              const page = await api(`/v1/campaigns${query({ cursor, limit: 25 })}`);
              if (page.data.length === 0) {
                replace(
                  results,
                  emptyState(
                    'No campaigns yet',
                    ['A campaign starts a live activity for a whole audience at once. Create one with ', code('POST /v1/campaigns'), ' (app key), naming a segment (', code('PUT /v1/segments/{id}'), '), a list of people, or everyone.'],
                  ),
                );
              } else {
                replace(
                  results,
                  table(
                    'Campaigns',
                    [
                      { label: 'Campaign', cell: (c) => h('a', { href: `#/campaigns/${segment(c.campaign_id)}` }, h('strong', { text: c.name }), h('div', { class: 'muted small mono', text: c.campaign_id })) },
                      { label: 'State', cell: (c) => badge(c.state) },
                      { label: 'Activity type', cell: (c) => h('span', { class: 'mono small', text: c.notification_type }) },
                      { label: 'Audience', className: 'num', cell: (c) => (c.audience_size == null ? '—' : formatNumber(c.audience_size)) },
                      { label: 'Starts', cell: (c) => time(c.start_at) },
                      { label: 'Created', cell: (c) => time(c.created_at) },
                    ],
                    page.data,
                    { 'data-testid': 'campaigns-table' },
                  ),
                  pager('campaigns', cursor, page.next_cursor, (to) => navigate('campaigns', { cursor: to })),
                );
              }
            } catch (error) {
              replace(results, errorNotice(error, 'Could not load campaigns: '));
            }
            results.setAttribute('aria-busy', 'false');
          })();
          return () => {};
        }

        // MARK: one campaign

        const OPEN_STATES = ['scheduled', 'starting', 'active', 'ending'];

        export function renderCampaign(main, id) {
          setTitle(`Campaign ${id}`);
          const body = h('div', { 'aria-busy': 'true' }, h('p', { class: 'loading', text: 'Loading…' }));
          const title = heading(id);
          replace(main, h('p', {}, h('a', { href: '#/campaigns', text: '← All campaigns' })), h('div', { class: 'page-head' }, title), body);
          const outcome = h('div', { 'aria-live': 'polite' });
          let stop = () => {};
          let editing = false;

          const load = async () => {
            if (editing) return;
            try {
              const campaign = await api(`/v1/campaigns/${segment(id)}`);
              title.querySelector('h1').textContent = campaign.name;
              setTitle(`Campaign ${campaign.name}`);
              replace(body, outcome, campaignView(campaign, { open: (operation) => openEditor(operation, campaign) }));
              if (!OPEN_STATES.includes(campaign.state)) stop();
            } catch (error) {
              // Only a campaign that is not there stops the refreshing; anything else may pass (the next try may work).
              if (error.status === 404) {
                replace(body, emptyState('No such campaign', 'Check the campaign ID, or pick one from the list.'));
                stop();
              } else {
                replace(body, errorNotice(error, 'Could not load the campaign (trying again every 10 s): '));
              }
            }
            body.setAttribute('aria-busy', 'false');
          };

          const openEditor = (operation, campaign) => {
            editing = true;
            const editor = changeEditor(operation, campaign, {
              done: async (result) => {
                editing = false;
                replace(outcome, h('div', { class: 'notice success', role: 'status', 'data-testid': 'change-result' }, `Campaign-wide ${operation} accepted: change ${result.change_id}, ${result.state}, due ${formatTime(result.due_at)}.`));
                await load();
                announce(`Campaign-wide ${operation} accepted`);
              },
              cancel: () => {
                editing = false;
                load();
              },
            });
            replace(body, outcome, editor);
            editor.querySelector('textarea').focus();
          };

          load();
          stop = every(10000, load);
          return () => stop();
        }

        function campaignView(campaign, { open }) {
          const changeable = OPEN_STATES.includes(campaign.state);
          const update = h('button', { class: 'button', type: 'button', text: 'Update all…', disabled: !changeable, 'data-testid': 'campaign-update' });
          const end = h('button', { class: 'button danger', type: 'button', text: 'End all…', disabled: !changeable, 'data-testid': 'campaign-end' });
          update.addEventListener('click', () => open('update'));
          end.addEventListener('click', () => open('end'));
          const facts = [
            ['State', badge(campaign.state)],
            ['Campaign ID', h('span', { class: 'mono', text: campaign.campaign_id })],
            ['Activity type', h('span', { class: 'mono', text: campaign.notification_type })],
            ['Audience', audience(campaign.audience)],
            ['Audience size', campaign.audience_size == null ? 'resolved when it starts' : formatNumber(campaign.audience_size)],
            ['Start', formatTime(campaign.start_at)],
            ['Started', formatTime(campaign.started_at)],
            ['Ended', formatTime(campaign.ended_at)],
          ];
          if (campaign.failure_reason) facts.splice(1, 0, ['Failure', campaign.failure_reason]);
          const instanceStates = Object.entries(campaign.instances ?? {});
          const skipped = Object.entries(campaign.skipped ?? {});
          return [
            h('div', { class: 'actions' }, update, end, changeable ? null : h('span', { class: 'muted small', text: `A campaign that is ${campaign.state} takes no more campaign-wide changes.` })),
            h(
              'div',
              { class: 'two-col' },
              h('section', { class: 'card', 'aria-labelledby': 'cfacts-h' }, h('h2', { id: 'cfacts-h', text: 'Summary' }), h('dl', { class: 'facts' }, facts.map(([term, value]) => [h('dt', { text: term }), h('dd', {}, value)]))),
              h(
                'section',
                { class: 'card', 'aria-labelledby': 'cinst-h' },
                h('h2', { id: 'cinst-h', text: 'Instances' }),
                instanceStates.length
                  ? h('ul', { class: 'stat-list' }, instanceStates.map(([state, n]) => h('li', {}, h('a', { href: `#/activities?campaign=${encodeURIComponent(campaign.campaign_id)}&state=${state}` }, badge(state)), h('span', { class: 'stat-value', text: formatNumber(n) }))))
                  : h('p', { class: 'muted', text: 'No instances yet: they are created when the campaign starts.' }),
                skipped.length ? [h('h3', { text: 'Skipped people' }), h('ul', { class: 'stat-list' }, skipped.map(([reason, n]) => h('li', {}, h('span', { text: reason.replace(/_/g, ' ') }), h('span', { class: 'stat-value', text: formatNumber(n) }))))] : null,
                h('p', {}, h('a', { href: `#/activities?campaign=${encodeURIComponent(campaign.campaign_id)}`, text: 'See its live activities →' })),
              ),
            ),
            funnelSection(campaign.funnel ?? []),
            schedulesSection(campaign.schedules ?? []),
            h('details', { class: 'card' }, h('summary', { text: 'Content state and attributes template' }), h('pre', { class: 'json', tabindex: '0', text: pretty({ content_state: campaign.content_state, attributes: campaign.attributes }) })),
          ];
        }

        function audience(value) {
          if (value?.segment) return h('span', {}, 'segment ', code(value.segment));
          if (Array.isArray(value?.people)) return `${plural(value.people.length, 'person', 'people')} named in the request`;
          if (value?.all) return 'everyone';
          return h('span', { class: 'mono', text: JSON.stringify(value) });
        }

        const STEPS = ['targeted', 'sent', 'delivered', 'opened'];

        function funnelSection(funnel) {
          const operations = [...new Set(funnel.map((row) => row.operation))];
          return h(
            'section',
            { class: 'card', 'aria-labelledby': 'funnel-h', 'data-testid': 'funnel' },
            h('h2', { id: 'funnel-h', text: 'Funnel' }),
            funnel.length === 0
              ? h('p', { class: 'muted', text: 'Nothing sent yet. Once the campaign starts, each platform shows devices targeted, pushes sent, and delivered and opened as the apps report them.' })
              : operations.map((operation) => {
                  const rows = funnel.filter((row) => row.operation === operation);
                  const byPlatform = new Map();
                  for (const row of rows) {
                    const sum = byPlatform.get(row.platform) ?? { targeted: 0, sent: 0, delivered: 0, opened: 0, queued: 0, failed: 0, undeliverable: 0, superseded: 0 };
                    for (const key of Object.keys(sum)) sum[key] += row[key] ?? 0;
                    byPlatform.set(row.platform, sum);
                  }
                  const groups = [...byPlatform.entries()].map(([platform, sum]) => ({
                    label: platform === 'ios' ? 'iOS' : platform === 'android' ? 'Android' : platform,
                    bars: STEPS.map((step) => ({ label: step[0].toUpperCase() + step.slice(1), value: sum[step] })),
                  }));
                  return h(
                    'div',
                    {},
                    h('h3', { text: `${operation[0].toUpperCase()}${operation.slice(1)} pushes` }),
                    barChart({ title: `Funnel of the campaign's ${operation} pushes per platform`, groups, testid: `funnel-${operation}` }),
                    h(
                      'details',
                      {},
                      h('summary', { text: 'All numbers' }),
                      table(`Funnel of ${operation}`, [
                        { label: 'Platform', cell: (r) => `${r.platform}${r.via === 'channel' ? ' (broadcast channel)' : ''}` },
                        ...['targeted', 'queued', 'sent', 'failed', 'undeliverable', 'superseded', 'delivered', 'opened'].map((key) => ({ label: key, className: 'num', cell: (r) => formatNumber(r[key]) })),
                      ], rows),
                    ),
                  );
                }),
          );
        }

        function schedulesSection(schedules) {
          return h(
            'section',
            { class: 'card', 'aria-labelledby': 'sched-h' },
            h('h2', { id: 'sched-h', text: 'Schedule' }),
            schedules.length
              ? table('Schedule', [
                  { label: 'Operation', cell: (c) => c.operation },
                  { label: 'Due', cell: (c) => formatTime(c.due_at) },
                  { label: 'State', cell: (c) => badge(c.state) },
                  { label: 'Ran', cell: (c) => formatTime(c.executed_at) },
                  { label: 'Result', cell: (c) => (c.result ? h('span', { class: 'mono small', text: summarize(c.result) }) : '—') },
                ], schedules, { 'data-testid': 'schedules-table' })
              : h('p', { class: 'muted', text: 'Nothing scheduled.' }),
          );
        }

        function summarize(result) {
          if (typeof result !== 'object' || result === null) return String(result);
          return Object.entries(result).map(([key, value]) => `${key.replace(/_/g, ' ')}: ${typeof value === 'object' ? JSON.stringify(value) : value}`).join(', ');
        }

        // MARK: campaign-wide changes

        /** A fresh Idempotency-Key (crypto.randomUUID needs a secure context; getRandomValues does not). */
        function idempotencyKey() {
          const bytes = crypto.getRandomValues(new Uint8Array(16));
          return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('')}`;
        }

        /**
         * The editor of a campaign-wide change's request body, its confirmation and its sending. It starts from an empty
         * patch: the campaign's content state is the start's template, not what its instances hold now (a patch of every
         * field would undo every change since), so it is shown beside the editor, read-only. The body is sent as the
         * text the operator reviewed, with one Idempotency-Key per text: sent again after an answer that never came (or
         * a 5xx), the campaign takes it at most once.
         */
        function changeEditor(operation, campaign, { done, cancel }) {
          const textarea = h('textarea', { id: 'change-json', rows: '12', spellcheck: 'false', 'aria-describedby': 'change-hint change-error' });
          textarea.value = pretty({ content_state_patch: {} });
          const error = h('div', { id: 'change-error', 'aria-live': 'assertive' });
          const review = h('button', { class: operation === 'end' ? 'button danger' : 'button', type: 'submit', text: operation === 'end' ? 'Review end…' : 'Review update…', 'data-testid': 'change-review' });
          const back = h('button', { class: 'button secondary', type: 'button', text: 'Cancel' });
          back.addEventListener('click', cancel);
          const open = (campaign.instances?.pending ?? 0) + (campaign.instances?.active ?? 0);
          const form = h(
            'form',
            { class: 'card', 'aria-labelledby': 'change-h', novalidate: true },
            h('h2', { id: 'change-h', text: operation === 'update' ? 'Update every live activity of this campaign' : 'End every live activity of this campaign' }),
            h('div', { class: 'field' },
              h('label', { for: 'change-json', text: `Request body of POST /v1/campaigns/${campaign.campaign_id}/${operation} (JSON)` }),
              h('p', { id: 'change-hint', class: 'hint' },
                operation === 'update'
                  ? ['Send ', code('content_state'), ' (the whole new state) or ', code('content_state_patch'), ' (a JSON merge patch applied to each instance). Optional: ', code('push_payload.alert'), ', ', code('stale_date'), ', ', code('relevance_score'), ', ', code('priority'), ', ', code('at'), ' (schedule it).']
                  : ['Optional: ', code('content_state_patch'), ' for the final state, ', code('dismissal_date'), ', ', code('at'), ' (schedule it). An end cancels every push not yet sent.']),
              textarea,
            ),
            h('details', {},
              h('summary', { text: 'The campaign’s start content state (read-only)' }),
              h('p', { class: 'hint', text: 'What the instances started with; each may have changed since. A patch changes only the fields it names.' }),
              h('pre', { class: 'json', tabindex: '0', 'data-testid': 'start-content-state', text: pretty(campaign.content_state ?? {}) })),
            error,
            h('div', { class: 'actions' }, review, back),
          );
          const confirm = h(
            'dialog',
            { 'aria-labelledby': 'confirm-h', 'data-testid': 'confirm-dialog' },
            h('h2', { id: 'confirm-h', text: operation === 'update' ? 'Send this update to the whole campaign?' : 'End the whole campaign?' }),
            h('p', {}, `This ${operation === 'update' ? 'updates' : 'ends'} every open live activity of “${campaign.name}” (${plural(open, 'open instance')} now, and any that start before the change runs) on every device. It cannot be undone.`),
            h('pre', { class: 'json', tabindex: '0' }),
            h('div', { class: 'actions' },
              h('button', { class: operation === 'end' ? 'button danger' : 'button', type: 'button', value: 'confirm', text: operation === 'update' ? 'Send update' : 'End campaign', 'data-testid': 'change-confirm' }),
              h('button', { class: 'button secondary', type: 'button', value: 'cancel', text: 'Go back' })),
          );
          form.append(confirm);
          // The text reviewed, and the Idempotency-Key of each text sent.
          let body = null;
          const keys = new Map();
          form.addEventListener('submit', (event) => {
            event.preventDefault();
            replace(error);
            textarea.removeAttribute('aria-invalid');
            try {
              const value = JSON.parse(textarea.value);
              if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('The body must be a JSON object.');
            } catch (problem) {
              textarea.setAttribute('aria-invalid', 'true');
              replace(error, h('p', { class: 'notice error', role: 'alert', text: `Not valid JSON: ${problem.message}` }));
              textarea.focus();
              return;
            }
            body = textarea.value;
            confirm.querySelector('pre').textContent = body;
            confirm.showModal();
            confirm.querySelector('[value="cancel"]').focus();
          });
          confirm.querySelector('[value="cancel"]').addEventListener('click', () => {
            confirm.close();
            review.focus();
          });
          const send = confirm.querySelector('[value="confirm"]');
          send.addEventListener('click', async () => {
            send.disabled = true;
            if (!keys.has(body)) keys.set(body, idempotencyKey());
            try {
              const result = await api(`/v1/campaigns/${segment(campaign.campaign_id)}/${operation}`, {
                method: 'POST',
                json: body,
                headers: { 'Idempotency-Key': keys.get(body) },
              });
              confirm.close();
              await done(result);
            } catch (problem) {
              confirm.close();
              send.disabled = false;
              if (problem.problem?.field) textarea.setAttribute('aria-invalid', 'true');
              // No answer, or the server failed: the change may have been taken. A 4xx was refused.
              const unknown = !(problem.status >= 400 && problem.status < 500);
              const notice = errorNotice(problem, unknown ? `Whether the ${operation} was taken is unknown: ` : `The ${operation} was refused: `);
              if (unknown) notice.append(` Sending the same body again is safe: it goes with the same Idempotency-Key, so the campaign takes the ${operation} at most once.`);
              replace(error, notice);
              textarea.focus();
            }
          });
          return form;
        }
        """#
}
