// The console's `app.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `app.js`: the entry module: sign-in, hash routes, sign-out.
    static let appJS = #"""
        // The console's entry point: sign-in, navigation between screens (hash routes), sign-out.
        //
        // Routes: #/overview, #/activities[?filters], #/activities/<id>, #/campaigns[?cursor], #/campaigns/<id>,
        // #/failures[?hours]. A link with #key=<app key> signs in; the fragment never reaches the server, and it is removed
        // from the address bar (history.replaceState) before anything else happens. A link whose key is not the one this
        // tab is signed in with (or any, in a tab signed in with none) asks first: anyone can send a link that signs the
        // reader in to their own tenant.
        import { api, storedKey, storeKey, forgetKey, setUnauthorizedHandler, ApiError } from './api.js';
        import { renderOverview } from './overview.js';
        import { renderActivities, renderActivity } from './activities.js';
        import { renderCampaigns, renderCampaign } from './campaigns.js';
        import { renderFailures } from './failures.js';
        import { h, replace, setTitle, errorNotice, code } from './ui.js';

        const main = document.getElementById('main');
        const nav = document.getElementById('nav');
        const signOutButton = document.getElementById('sign-out');
        const keyHint = document.getElementById('key-hint');
        let leave = () => {};

        /** Goes to `section` with `params` (empty values dropped). */
        function navigate(section, params = {}) {
          const search = new URLSearchParams();
          for (const [name, value] of Object.entries(params)) if (value) search.set(name, value);
          const text = search.toString();
          location.hash = `#/${section}${text ? `?${text}` : ''}`;
        }

        function parseRoute() {
          const raw = location.hash.startsWith('#/') ? location.hash.slice(2) : 'overview';
          const [path, search = ''] = raw.split('?');
          const parts = path.split('/').filter(Boolean).map((part) => {
            try {
              return decodeURIComponent(part);
            } catch {
              return part;
            }
          });
          return { section: parts[0] ?? 'overview', id: parts[1], params: new URLSearchParams(search) };
        }

        function render() {
          leave();
          leave = () => {};
          if (!storedKey()) {
            showSignIn();
            return;
          }
          nav.hidden = false;
          signOutButton.hidden = false;
          const { section, id, params } = parseRoute();
          for (const link of nav.querySelectorAll('a')) {
            if (link.dataset.section === section) link.setAttribute('aria-current', 'page');
            else link.removeAttribute('aria-current');
          }
          const screens = {
            overview: () => renderOverview(main),
            activities: () => (id ? renderActivity(main, id) : renderActivities(main, params, navigate)),
            campaigns: () => (id ? renderCampaign(main, id) : renderCampaigns(main, params, navigate)),
            failures: () => renderFailures(main, params, navigate),
          };
          const screen = screens[section];
          if (!screen) {
            setTitle('Not found');
            replace(main, h('h1', { tabindex: '-1', text: 'Page not found' }), h('p', {}, h('a', { href: '#/overview', text: 'Go to the overview' })));
          } else {
            leave = screen() ?? (() => {});
          }
          main.querySelector('h1')?.focus({ preventScroll: true });
        }

        function explain(error) {
          if (!(error instanceof ApiError)) return 'The key could not be checked.';
          if (error.status === 401) {
            return 'This app key was not accepted. Check that you copied the whole key (it starts with mq_app_) and that it has not been revoked or rotated.';
          }
          if (error.status === 403) return 'This is not an app key. The console needs the tenant’s app key (mq_app_…), not its sdk key.';
          if (error.status === 0) return 'The Marquee server could not be reached. Check your connection and try again.';
          return `The key could not be checked: ${error.problem.detail || error.message}`;
        }

        /** Checks `key` against the API and keeps it only if the API accepts it as an app key. */
        async function signIn(key) {
          await api('/v1/overview', { key });
          storeKey(key);
          showKeyHint(key);
        }

        /**
         * How a key is shown: the tenant it names (a key carries its tenant's ID) and the hint the key listings show,
         * the kind and the secret's first six characters (APIKeyText.hint on the server).
         */
        function keyLabel(key) {
          const [, kind, tenant, secret] = key.match(/^mq_([a-z]+)_([0-9a-f]{32})_(.+)$/) ?? [];
          return tenant ? `tenant ${tenant.slice(0, 8)} · mq_${kind}_…${secret.slice(0, 6)}` : 'an unrecognised key';
        }

        function showKeyHint(key) {
          keyHint.textContent = key ? `Signed in · ${keyLabel(key)}` : '';
          keyHint.hidden = !key;
        }

        function showSignIn(message) {
          setTitle('Sign in');
          nav.hidden = true;
          signOutButton.hidden = true;
          keyHint.hidden = true;
          const input = h('input', {
            id: 'app-key',
            name: 'app-key',
            type: 'password',
            autocomplete: 'off',
            spellcheck: 'false',
            required: true,
            'aria-describedby': 'app-key-hint sign-in-error',
          });
          const error = h('div', { id: 'sign-in-error' }, message ? h('p', { class: 'notice error', role: 'alert', 'data-testid': 'sign-in-error', text: message }) : null);
          const submit = h('button', { class: 'button', type: 'submit', text: 'Sign in' });
          const form = h(
            'form',
            { 'aria-labelledby': 'sign-in-h', novalidate: true },
            h('div', { class: 'field' }, h('label', { for: 'app-key', text: 'App key' }), input,
              h('p', { id: 'app-key-hint', class: 'hint' }, 'The tenant’s app key (', code('mq_app_…'), '). It stays in this tab only and is forgotten when you close it.')),
            error,
            submit,
          );
          form.addEventListener('submit', async (event) => {
            event.preventDefault();
            const key = input.value.trim();
            replace(error);
            if (!key) {
              input.setAttribute('aria-invalid', 'true');
              replace(error, h('p', { class: 'notice error', role: 'alert', 'data-testid': 'sign-in-error', text: 'Enter an app key.' }));
              input.focus();
              return;
            }
            submit.disabled = true;
            try {
              await signIn(key);
              input.value = '';
              if (!location.hash.startsWith('#/')) history.replaceState(null, '', `${location.pathname}${location.search}#/overview`);
              render();
            } catch (problem) {
              input.setAttribute('aria-invalid', 'true');
              replace(error, h('p', { class: 'notice error', role: 'alert', 'data-testid': 'sign-in-error', text: explain(problem) }));
              input.focus();
            } finally {
              submit.disabled = false;
            }
          });
          replace(
            main,
            h('section', { class: 'signin card' }, h('h1', { id: 'sign-in-h', tabindex: '-1', text: 'Sign in to the Marquee console' }),
              h('p', { class: 'muted', text: 'See what your live activities, campaigns and deliveries are doing.' }), form),
          );
          input.focus();
        }

        function signOut(message) {
          leave();
          leave = () => {};
          forgetKey();
          history.replaceState(null, '', `${location.pathname}${location.search}`);
          showSignIn(message);
        }

        async function start() {
          document.getElementById('skip-link').addEventListener('click', (event) => {
            event.preventDefault();
            main.focus();
          });
          signOutButton.addEventListener('click', () => signOut());
          setUnauthorizedHandler(() => signOut('Your app key is no longer accepted (revoked or rotated). Sign in again.'));
          window.addEventListener('hashchange', () => {
            if (location.hash.startsWith('#key=')) {
              fragmentSignIn();
              return;
            }
            if (location.hash === '' || location.hash.startsWith('#/')) render();
          });
          if (location.hash.startsWith('#key=')) {
            await fragmentSignIn();
            return;
          }
          showKeyHint(storedKey());
          render();
        }

        /**
         * `#key=<app key>`: the key is taken out of the address bar at once. A key other than the tab's own is used only
         * once the operator says so (`confirmLinkKey`), in a tab signed in with none too: otherwise a link from anyone
         * would sign its reader in to the sender's tenant, and what they then did (a campaign-wide change) would go
         * there. The tab's own key is checked again; only its refusal (401, 403) signs the tab out, not a failure that
         * may pass (no answer, 429, 5xx).
         */
        async function fragmentSignIn() {
          const fragment = new URLSearchParams(location.hash.slice(1));
          const key = (fragment.get('key') ?? '').trim();
          history.replaceState(null, '', `${location.pathname}${location.search}#/overview`);
          if (!key) {
            showSignIn();
            return;
          }
          const current = storedKey();
          if (current !== key) {
            confirmLinkKey(key, current);
            return;
          }
          replace(main, h('p', { class: 'loading', text: 'Signing in…' }));
          try {
            await signIn(key);
          } catch (error) {
            if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
              forgetKey();
              showSignIn(explain(error));
              return;
            }
            showKeyHint(current);
          }
          render();
        }

        /**
         * A `#key=` link with a key this tab does not use: nothing changes until the operator chooses. The screen names
         * the tenant and key of the link (and of the current key, when there is one); not using the link's key is the
         * default (it has the focus), and the link's key is held by this screen only.
         */
        function confirmLinkKey(key, current) {
          leave();
          leave = () => {};
          nav.hidden = !current;
          signOutButton.hidden = !current;
          showKeyHint(current);
          setTitle(current ? 'Switch keys?' : 'Sign in with this link?');
          const keep = h('button', { class: 'button', type: 'button', 'data-testid': 'keep-key', text: current ? 'Keep the current key' : 'Don’t sign in' });
          const use = h('button', { class: 'button secondary', type: 'button', 'data-testid': 'switch-key', text: current ? 'Use the link’s key' : 'Sign in' });
          const error = h('div', { role: 'status' });
          keep.addEventListener('click', () => (current ? render() : showSignIn()));
          use.addEventListener('click', async () => {
            use.disabled = true;
            try {
              await signIn(key);
              render();
            } catch (problem) {
              if (!current) {
                showSignIn(explain(problem));
                return;
              }
              replace(error, h('p', { class: 'notice error', role: 'alert', 'data-testid': 'switch-error', text: `${explain(problem)} The current key is kept.` }));
              use.disabled = false;
            }
          });
          replace(
            main,
            h('section', { class: 'signin card', 'data-testid': 'confirm-switch' },
              current
                ? [
                    h('h1', { tabindex: '-1', text: 'This link signs in with another key' }),
                    h('p', {}, 'You are signed in with ', code(keyLabel(current)), '. The link you opened carries ', code(keyLabel(key)),
                      '. Use it only if you expected to change tenants: anyone can send a link that signs you in to their own.'),
                  ]
                : [
                    h('h1', { tabindex: '-1', text: 'Sign in with this link?' }),
                    h('p', {}, 'The link you opened signs in with ', code(keyLabel(key)), '. Sign in only if you expected this tenant: anyone can send a link that signs you in to their own.'),
                  ],
              error,
              h('div', { class: 'actions' }, keep, use)),
          );
          keep.focus();
        }

        start().catch((error) => replace(main, errorNotice(error, 'The console could not start: ')));
        """#
}
