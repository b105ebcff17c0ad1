-- wrk script: POSTs pre-signed notification bodies, one per line of BODIES_FILE.
-- Each wrk thread takes every Nth line so threads never send the same notification twice
-- until they run out; then they wrap around (duplicates, still answered 200).
local bodies = {}
local index = 0
local step = 1

function setup(thread)
  thread:set("thread_id", tostring(#threads_seen + 1))
  table.insert(threads_seen, thread)
end
threads_seen = {}

function init(args)
  local path = os.getenv("BODIES_FILE")
  local id = tonumber(thread_id or "1")
  local count = tonumber(os.getenv("WRK_THREADS") or "1")
  local n = 0
  for line in io.lines(path) do
    n = n + 1
    if (n - id) % count == 0 then table.insert(bodies, line) end
  end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  index = index + 1
  if index > #bodies then index = 1 end
  return wrk.format(nil, nil, nil, bodies[index])
end


function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_s=%.3f rps=%.1f p50_ms=%.2f p99_ms=%.2f errors=%d non2xx=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
