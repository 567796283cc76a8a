-- wrk script: PUT a fresh push-to-start token for one of DEVICES devices, so every request rotates a token
-- (retires the active one, inserts the new one) — the write path a device's token refresh takes.
local devices = tonumber(os.getenv("DEVICES") or "1000")
local key = os.getenv("SDK_KEY")
local counter = 0

local function hex(n, width)
  return string.format("%0" .. width .. "x", n)
end

function setup(thread)
  thread:set("seed", math.random(1, 1000000))
end

function init(args)
  math.randomseed(seed or os.time())
end

request = function()
  counter = counter + 1
  local d = math.random(0, devices - 1)
  local device = string.rep(hex(d, 8), 8)
  local token = hex(math.random(0, 0x7fffffff), 8) .. hex(counter, 8) .. string.rep("ab", 24)
  local body = '{"token":"' .. token .. '","attributes_type":"DeliveryAttributes"}'
  local path = "/v1/people/p" .. d .. "/devices/" .. device .. "/push_to_start/com.example.delivery"
  return wrk.format("PUT", path, {
    ["Authorization"] = "Bearer " .. key,
    ["Content-Type"] = "application/json",
  }, body)
end

local statuses = {}
response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

done = function(summary, latency, requests)
  io.write(string.format("p50 %.2f ms, p99 %.2f ms\n", latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
