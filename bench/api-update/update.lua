-- wrk script: POST /v1/live_notifications/update for a random one of INSTANCES instances, each with a new
-- content_state_patch value (so that no update is suppressed as a no-op).
local instances = tonumber(os.getenv("INSTANCES") or "10000")
local key = os.getenv("APP_KEY")
local counter = 0

function setup(thread)
  thread:set("seed", math.random(1, 1000000))
end

function init(args)
  math.randomseed(seed or os.time())
end

request = function()
  counter = counter + 1
  local i = math.random(0, instances - 1)
  -- A random step, not the counter: each wrk thread (and process) has its own counter, and equal patches to one
  -- instance would be suppressed as no-ops.
  local body = '{"instance_id":"bench-' .. i .. '","content_state_patch":{"step":' .. math.random(1, 2000000000) .. ',"status":"moving"}}'
  return wrk.format("POST", "/v1/live_notifications/update", {
    ["Authorization"] = "Bearer " .. key,
    ["Content-Type"] = "application/json",
  }, body)
end

local non2xx = 0
response = function(status, headers, body)
  if status ~= 200 then non2xx = non2xx + 1 end
end

done = function(summary, latency, requests)
  io.write(string.format("p50 %.2f ms, p99 %.2f ms\n", latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
