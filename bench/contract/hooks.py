# Schemathesis hooks for bench/contract: NDJSON bodies (POST /v1/people/import) are sent as the generated text.
import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else str(value)).encode("utf-8", "surrogatepass")
