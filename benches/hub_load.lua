-- wrk script for benches/hub_load.sh: conditional GETs spread over many clusters.
-- REQUESTS names a file of tab-separated lines: path, bearer token, ETag.
-- Every request is built once in init(), so wrk's Lua costs the same for both
-- servers and stays out of the measurement as far as it can.

local requests = {}
local index = 0

function init(args)
  local file = assert(io.open(os.getenv("REQUESTS"), "r"))
  for line in file:lines() do
    local path, token, etag = line:match("^([^\t]+)\t([^\t]+)\t(.+)$")
    if path then
      requests[#requests + 1] = wrk.format("GET", path, {
        ["Authorization"] = "Bearer " .. token,
        ["If-None-Match"] = etag,
        ["Accept-Encoding"] = "gzip, zstd",
      })
    end
  end
  file:close()
  assert(#requests > 0, "no requests in " .. os.getenv("REQUESTS"))
  -- Threads start at different places so they do not walk in step.
  index = math.random(#requests)
end

function request()
  index = index % #requests + 1
  return requests[index]
end
