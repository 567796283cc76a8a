// The console's `api.js`, exactly as the browser gets it (ConsoleRoutes says why it is embedded in the binary).

extension ConsoleFiles {
    /// `api.js`: calls to the JSON API with the app key kept in `sessionStorage`.
    static let apiJS = #"""
        // The JSON API as the console calls it: the app key from sessionStorage as the bearer token, problems as ApiError.
        // The key lives in sessionStorage only (gone when the tab closes), never in localStorage, a cookie or a URL.

        const STORAGE_KEY = 'marquee.console.appKey';

        /** An answer that is not 2xx, with its problem document (RFC 9457) when the server sent one. */
        export class ApiError extends Error {
          constructor(status, problem) {
            super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
            this.status = status;
            this.problem = problem || {};
          }
        }

        export function storedKey() {
          return sessionStorage.getItem(STORAGE_KEY);
        }

        export function storeKey(key) {
          sessionStorage.setItem(STORAGE_KEY, key);
        }

        export function forgetKey() {
          sessionStorage.removeItem(STORAGE_KEY);
        }

        let onUnauthorized = () => {};

        /** Called when a stored key stops working (revoked or rotated while the console is open). */
        export function setUnauthorizedHandler(handler) {
          onUnauthorized = handler;
        }

        /** A query string from the defined, non-empty values of `params` ('' when there are none). */
        export function query(params) {
          const search = new URLSearchParams();
          for (const [name, value] of Object.entries(params)) {
            if (value !== undefined && value !== null && value !== '') search.set(name, String(value));
          }
          const text = search.toString();
          return text ? `?${text}` : '';
        }

        /** One path segment, percent-encoded. */
        export const segment = (value) => encodeURIComponent(value);

        /**
         * Calls the API. `key` overrides the stored key (sign-in checks a key before keeping it). `body` is sent as JSON;
         * `json` is a body already in JSON text, sent as it is (what the operator wrote and reviewed: a value through
         * JSON.parse and back may change, e.g. an integer beyond 2^53 is rounded).
         * Resolves to the decoded JSON body (null for an empty one); rejects with an ApiError (status 0: no answer).
         */
        export async function api(path, { method = 'GET', body, json, key, headers = {} } = {}) {
          const bearer = key ?? storedKey();
          if (!bearer) throw new ApiError(401, { title: 'Not signed in', detail: 'Sign in with an app key.' });
          const init = {
            method,
            headers: { Accept: 'application/json', Authorization: `Bearer ${bearer}`, ...headers },
            cache: 'no-store',
            credentials: 'omit',
            referrerPolicy: 'no-referrer',
          };
          if (body !== undefined || json !== undefined) {
            init.body = json ?? JSON.stringify(body);
            init.headers['Content-Type'] = 'application/json';
          }
          let response;
          try {
            response = await fetch(path, init);
          } catch {
            throw new ApiError(0, { title: 'Network error', detail: 'The Marquee server could not be reached.' });
          }
          const text = await response.text();
          let data = null;
          if (text) {
            try {
              data = JSON.parse(text);
            } catch {
              data = null;
            }
          }
          if (!response.ok) {
            const error = new ApiError(response.status, data || { title: response.statusText });
            if (response.status === 401 && key === undefined) onUnauthorized(error);
            throw error;
          }
          return data;
        }

        /** Like `api`, but a 404 resolves to null (e.g. credentials that were never uploaded). */
        export async function apiOrNull(path, options) {
          try {
            return await api(path, options);
          } catch (error) {
            if (error instanceof ApiError && error.status === 404) return null;
            throw error;
          }
        }
        """#
}
