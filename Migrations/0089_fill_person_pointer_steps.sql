-- A campaign's `$person` pointer is walked as RFC 6901 walks it. marquee_fill_person (0062) read the pointer as a
-- text[] path with `#>`, which reads a token as an array index the way strtol does: `/tags/-1` filled the last
-- element, `/tags/01`, `/tags/+1` and `/tags/ 1` element 1. RFC 6901 names an element only by `0` or digits without
-- a leading zero (and `-`, past the end, never one); any other token names an object's member only.
--
-- The rule's one home is JSONPointer.arrayIndex (MarqueeCore); PersonTemplate.fillsJSON now writes each fill's
-- pointer as `path`, a token that names an element as a number (walked with `#>`: the element, or the member of that
-- name) and any other as a string (walked with `->`, which finds nothing in an array). Fills stored by a campaign
-- created before this migration still carry `pointer` (all strings) and are read as before.
CREATE OR REPLACE FUNCTION marquee_fill_person(p_template jsonb, p_fills jsonb, p_person jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    f jsonb;
    v jsonb;
    t jsonb;
    path text[];
    result jsonb := p_template;
BEGIN
    FOR i IN 0 .. jsonb_array_length(p_fills) - 1 LOOP
        f := p_fills -> i;
        IF f ? 'path' THEN
            v := p_person;
            FOR k IN 0 .. jsonb_array_length(f -> 'path') - 1 LOOP
                t := f -> 'path' -> k;
                IF jsonb_typeof(t) = 'number' THEN
                    v := v #> ARRAY[t #>> '{}'];
                ELSE
                    v := v -> (t #>> '{}');
                END IF;
                EXIT WHEN v IS NULL;
            END LOOP;
        ELSE
            path := '{}';
            FOR k IN 0 .. jsonb_array_length(f -> 'pointer') - 1 LOOP
                path := path || (f -> 'pointer' ->> k);
            END LOOP;
            v := p_person #> path;
        END IF;
        IF v IS NULL OR v = 'null'::jsonb THEN
            v := f -> 'default';
            IF v IS NULL THEN
                RETURN NULL;
            END IF;
        END IF;
        path := '{}';
        FOR k IN 0 .. jsonb_array_length(f -> 'at') - 1 LOOP
            path := path || (f -> 'at' ->> k);
        END LOOP;
        result := jsonb_set(result, path, v, false);
    END LOOP;
    RETURN result;
END
$$;
