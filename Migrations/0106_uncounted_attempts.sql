-- Attempts that say nothing of the push no longer spend its retry budget.
--
-- Every attempt recorded as a retry or a park added one to `attempts`, and the worker gave a push up once
-- `attempts` reached MARQUEE_RETRY_MAX_ATTEMPTS. The attempts the worker ended itself (a credential it could not load,
-- its own shutdown: RetryPolicy.uncounted) were already never the last one, but they counted towards it, as did parks
-- (the provider refused the tenant's credential, not the push): after ten retries for a credential that would not load
-- (a key rotation missing its previous key, a pool timing out), the provider's first 503 failed the push "gave up after
-- 11 attempts". `attempts` still counts every attempt (the API shows it); those that do not spend the budget
-- (RetryPolicy.spendsBudget, the rule's one home) are counted apart here, and the budget is spent by the others.
ALTER TABLE delivery_queue ADD COLUMN uncounted_attempts integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN delivery_queue.uncounted_attempts IS
    'Of attempts, those that did not spend the retry budget: the worker''s own retries and parks '
    '(RetryPolicy.spendsBudget).';
