r"""The Redis layout of a shared crawl and the Lua scripts that change it.

Pure: no Scrapy or Twisted import, and no import of the ``redis`` client
either (the caller passes its client in), so the package imports without it.

**Partitions.** A crawl's hosts are spread over its *partitions* (their
number fixed when the crawl is created, :func:`open_crawl`): a host belongs
to partition ``crc32(host) % n`` (:func:`partition_of`), the same in every
process and every run. Each partition is a complete shared frontier of its
own hosts under its own hash tag, ``hq:{<crawl id>/<suffix>}:``, so that a
Redis Cluster spreads one crawl over its masters while every script touches
one partition (one slot). A request lives in its host's partition with its
fingerprint: the same URL always has the same host, so the dupefilter stays
exact. Every process is registered in every partition (its heartbeat renewed
in each, and what a dead process held is reclaimed in each). On one server
the suffixes are ``0`` to ``n - 1``; on a Redis Cluster each is chosen when
the crawl is made (``3``, else ``3.1``, ``3.2``...) so that the partitions
are dealt evenly over the masters serving the slots at that time. The fair
share a claim applies is its partition's (its hosts over the live
processes); a process gives back what it holds beyond the crawl's (the
partitions' sums, see ``_store``).

The crawl's own keys, under ``hq:{<crawl id>}:`` (its *home*):

``version``     the layout version; another one is refused. Written last
                when the crawl is made: a crawl with it is complete
``partitions``  the suffixes of the partitions, space-separated, in order
``procseq``     counter giving processes their ids
``monitor``...  the live monitor's (see ``_monitor``)

Keys of each partition (after its prefix):

``crawl``       the crawl's identity: a random token written when the crawl
                is created, the same in every partition; every script checks
                it first (see below)
``procs``       zset: process id -> heartbeat expiry (ms since the epoch)
``r``           hash: request id -> ``"<rank> <host>\n"`` + the encoded request,
                for the requests leased and those queued by id (``b:<host>``)
``q:<host>``    zset: the ranks the host has requests of in ``l:<host>:<rank>``
                (member the rank, score minus the rank: the highest first)
``l:<host>:<rank>`` list: the host's queued requests of that rank, oldest
                first, each its encoded form only (the lean entries: a few
                bytes of Redis overhead each, see below)
``b:<host>``    zset: the host's requests queued by id, values in ``r``
                (given back after a lease, or pushed without a fingerprint),
                score ``-rank * 1e9 + order``; served before the lists' of
                a lower rank
``qcount``      zset: host -> requests queued (the report's per-host counts,
                and the count the scripts read)
``avail``       zset: host -> when it may be claimed (ms): hosts with queued
                requests that no process holds
``owner``       hash: host -> the process holding it
``held:<proc>`` set: the hosts a process holds
``lease:<proc>`` set: the request ids a process has leased
``state``       hash: host -> its state as JSON (limit, block, spacing,
                learned), written when a process saves or gives the host back
``ready``       hash: host -> when it may be claimed again (ms), if later than now
``fp``          hash: the dupefilter: ``mode`` (``exact`` or ``bloom``), and
                for ``exact`` the fingerprints counted (``n``) and the
                buckets' ``level`` and ``split`` (see below)
``f:<n>``       hash: a bucket of fingerprints (exact mode): the first 8
                bytes of each fingerprint -> the number of the process that
                pushed it
``bloom``       the Bloom filter of the fingerprints (``BF.*``; bloom mode)
``gaveup``      set: hosts given up (their requests are refused)
``hungry``      zset: process -> when it last wanted hosts, found none and held
                fewer than its fair share (ms)
``share:<host>`` hash: a busy host shared by its holder (``owner``) with one
                co-holder (``co``): the host's ``limit`` split, the co-holder's
                part (``grant``), the latest block either saw (``block``, ms)
                and ``recall`` once the holder wants its part back
``offers``      zset: host -> when its holder offered a part of it (ms), while
                no co-holder has taken it
``coheld:<proc>`` set: the hosts a process co-holds
``wantshare``   zset: process -> when it last wanted hosts and found none (ms)
``stats``       hash: the partition's counters, whose sums are the crawl's
                (``queued``, ``leased``, ``pushed``, ``duplicates``,
                ``acked``, ``reclaimed``, ``claims``)
``backlog``     hash: process -> requests it keeps back while Redis is full
                (the crawl is not finished while one holds any; in the
                first partition only)

A request id is ``<proc>.<n>``, chosen by the process that pushes it, so
that every script is idempotent: a batch whose answer was lost with the
connection is sent again as it was. A request queued in a list has no id
there: the script that leases it gives it one (``t<n>``), and a push sent
again finds it by its fingerprint, whose bucket holds the pushing process's
number (the push sent again answers "queued", not "duplicate").

**Lean bytes.** A request waiting in a host's queue is one list element: its
encoded form (the codec's, with the host and the rank in the key), a few
bytes of list overhead. The fingerprint of a request, queued or done, is 8
bytes in one of many small hashes (linear hashing: one bucket more, split
from the next one in turn, each time the fingerprints pass :data:`FP_LOAD`
per bucket, so that a bucket stays a listpack of well under 128 entries):
about 14.5 bytes each, exact up to the odds of two URLs sharing 64 bits of
fingerprint (``n**2 / 2**65``: 2.7e-4 at 1e8 URLs, 2.7e-2 at 1e9). The Bloom
mode keeps a Bloom filter instead (``BF.ADD``), its false positives being
pages never fetched.

**The crawl's identity.** Every script takes the crawl's token
(``ARGV[1]``, what ``crawl`` held when the process joined) and answers the
error :data:`LOST` without touching anything when ``crawl`` holds another
one, or none: the Redis restarted without its data, was flushed, or the URL
now names another server (or, on a Redis Cluster, the master of that
partition lost its data). Nothing is written into a Redis that lost the
crawl, and the process knows at its next exchange with that partition. A
process joining a crawl whose partitions do not all hold its token is
refused.

**A full Redis** (``maxmemory`` with ``noeviction``) refuses a script's
first write that may grow its memory, with nothing applied, and lets a
script that already wrote run to its end. Only the push script may be
refused so; every other script frees or moves memory (acknowledgements,
hand-backs, reclaims, the heartbeat), and starts with a write that deletes
nothing, so that it runs when Redis is full: what makes room never waits
for room.
"""

from __future__ import annotations

import hashlib
import secrets
import zlib
from collections.abc import Callable
from typing import Any

from scrapy_hostqueue._errors import RedisFrontierError

#: The layout of the keys; a crawl id written with another is refused.
LAYOUT_VERSION = "4"
#: The error a script answers when Redis no longer holds the crawl it was
#: given the token of.
LOST = "HQLOST"

#: Redis sorted-set scores are doubles: a request's score is ``-rank * ORDER
#: + order``, exact while ``|rank| < RANK_LIMIT``.
_ORDER = 1_000_000_000
RANK_LIMIT = 4_000_000
#: Fingerprints per bucket (on average) past which one bucket more is made.
FP_LOAD = 48
#: Bytes of a fingerprint kept (see :func:`fingerprint_key`).
FP_BYTES = 8
#: About what a fingerprint costs in Redis (exact mode), and a request
#: queued in a list besides its encoded form (bytes, as measured by
#: ``python -m bench.redis_scale --parts m``).
FP_COST = 15
QUEUED_BYTES = 4


def prefix(crawl_id: str) -> str:
    """Return the prefix of *crawl_id*'s own keys, its home (with its hash tag)."""
    return f"hq:{{{crawl_id}}}:"


def part_prefix(crawl_id: str, suffix: str = "0") -> str:
    """Return the key prefix of the partition *suffix* of *crawl_id* (its own hash tag)."""
    return f"hq:{{{crawl_id}/{suffix}}}:"


def partition_of(host: str, partitions: int) -> int:
    """Return the index of the partition of *host* among *partitions*.

    ``crc32`` of the host: the same in every process (unlike ``hash()``).
    """
    return zlib.crc32(host.encode()) % partitions if partitions > 1 else 0


# What every script shares. A script's body runs in ``run``, which writes
# what it accumulated once at its end: the crawl-wide counters (one HINCRBY
# per counter, not per request), the per-host queue counts, the order
# counter, the values and leases of the requests it added; and host lookups
# (owner, ready time, given up) are read once per script.
_COMMON = (
    """
local P = KEYS[1]
if redis.call('GET', P..'crawl') ~= ARGV[1] then
  return redis.error_reply('%(lost)s this Redis does not hold the crawl')
end
-- The script's own arguments follow the token.
local ARGV = (function(all)
  local rest = {}
  for i = 2, #all do rest[i - 1] = all[i] end
  return rest
end)(ARGV)
-- A write that deletes nothing: a script that calls it first runs when
-- Redis is full (maxmemory, noeviction), which refuses only a script's
-- first write that may grow its memory.
local function pass_when_full()
  redis.call('DEL', P..'none')
end
local counters, qdelta, memo_owner, memo_ready, memo_gaveup, in_avail = {}, {}, {}, {}, {}, {}
local memo_shared = {}
local new_values, new_leases, new_lists = {}, {}, {}
local order_next
local function hinc(field, n)
  counters[field] = (counters[field] or 0) + n
end
local function parse(v)
  local nl = string.find(v, '\\n', 1, true)
  local head = string.sub(v, 1, nl - 1)
  local sp = string.find(head, ' ', 1, true)
  return string.sub(head, sp + 1), tonumber(string.sub(head, 1, sp - 1))
end
local function owner_of(host)
  local o = memo_owner[host]
  if o == nil then
    o = redis.call('HGET', P..'owner', host) or false
    memo_owner[host] = o
  end
  return o
end
local function set_owner(host, proc)
  if proc then
    redis.call('HSET', P..'owner', host, proc)
  else
    redis.call('HDEL', P..'owner', host)
  end
  memo_owner[host] = proc
end
local function ready_at(host)
  local r = memo_ready[host]
  if r == nil then
    r = tonumber(redis.call('HGET', P..'ready', host) or '0')
    memo_ready[host] = r
  end
  return r
end
local function gave_up(host)
  local g = memo_gaveup[host]
  if g == nil then
    g = redis.call('SISMEMBER', P..'gaveup', host) == 1
    memo_gaveup[host] = g
  end
  return g
end
-- Whether a share record of the host exists: then the host is not
-- claimable whole (its co-holder may have requests in flight) until the
-- share ends.
local function shared(host)
  local s = memo_shared[host]
  if s == nil then
    s = redis.call('EXISTS', P..'share:'..host) == 1
    memo_shared[host] = s
  end
  return s
end
-- The requests queued for the host, as this script left them so far.
local function count_of(host)
  return tonumber(redis.call('ZSCORE', P..'qcount', host) or '0') + (qdelta[host] or 0)
end
local function queued_one(host)
  qdelta[host] = (qdelta[host] or 0) + 1
  hinc('queued', 1)
  if not owner_of(host) and not in_avail[host] and not shared(host) then
    redis.call('ZADD', P..'avail', 'NX', ready_at(host), host)
    in_avail[host] = true
  end
end
local function next_order()
  if not order_next then
    order_next = tonumber(redis.call('GET', P..'order') or '0')
  end
  order_next = order_next + 1
  return order_next
end
-- A request queued by id (its value in r).
local function enqueue(host, id, rank)
  local score = string.format('%%.0f', -rank * %(order)d + next_order() %% %(order)d)
  if redis.call('ZADD', P..'b:'..host, score, id) == 0 then return end
  queued_one(host)
end
-- A request queued as its encoded form only, at the end of its rank's list
-- (written at the script's end, one RPUSH per list).
local function enqueue_lean(host, rank, data)
  local name = 'l:'..host..':'..rank
  local values = new_lists[name]
  if not values then
    values = {}
    new_lists[name] = values
    redis.call('ZADD', P..'q:'..host, -tonumber(rank), rank)
  end
  values[#values + 1] = data
  queued_one(host)
end
-- Up to n of the host's queued requests, in serving order, leased to proc:
-- {id, value, ...}. A request from a list gets its id now.
local function take(proc, host, n)
  local out, leased = {}, {}
  local k = 0
  local by_id = redis.call('ZRANGE', P..'b:'..host, 0, 0, 'WITHSCORES')
  while k < n do
    local top = redis.call('ZRANGE', P..'q:'..host, 0, 0)[1]
    local brank = by_id[1] and -math.floor(tonumber(by_id[2]) / %(order)d)
    if not top and not brank then break end
    if brank and (not top or brank >= tonumber(top)) then
      local id = by_id[1]
      redis.call('ZREM', P..'b:'..host, id)
      k = k + 1
      local v = redis.call('HGET', P..'r', id)
      if v then
        leased[#leased + 1] = id
        out[#out + 1] = id
        out[#out + 1] = v
      end
      by_id = redis.call('ZRANGE', P..'b:'..host, 0, 0, 'WITHSCORES')
    else
      local items = redis.call('LPOP', P..'l:'..host..':'..top, n - k) or {}
      if #items < n - k then redis.call('ZREM', P..'q:'..host, top) end
      local head = top..' '..host..'\\n'
      for _, data in ipairs(items) do
        local id = 't'..string.format('%%.0f', next_order())
        local v = head..data
        new_values[#new_values + 1] = id
        new_values[#new_values + 1] = v
        leased[#leased + 1] = id
        out[#out + 1] = id
        out[#out + 1] = v
      end
      k = k + #items
    end
  end
  if k == 0 then return out end
  if #leased > 0 then
    new_leases[proc] = new_leases[proc] or {}
    for _, id in ipairs(leased) do table.insert(new_leases[proc], id) end
  end
  hinc('queued', -k)
  hinc('leased', #leased)
  qdelta[host] = (qdelta[host] or 0) - k
  return out
end
local function give_back(proc, id)
  if redis.call('SREM', P..'lease:'..proc, id) == 0 then return 0 end
  hinc('leased', -1)
  local v = redis.call('HGET', P..'r', id)
  if v then
    local host, rank = parse(v)
    enqueue(host, id, rank)
  end
  return 1
end
local function make_claimable(host)
  if not owner_of(host) and count_of(host) > 0 then
    redis.call('ZADD', P..'avail', ready_at(host), host)
    in_avail[host] = true
  end
end
-- The share of a host is over (its co-holder has nothing of it in flight,
-- or is dead): the holder, if any, gets its whole limit back when it reads
-- that the record is gone; a host with no holder is claimable again.
local function end_share(host)
  local co = redis.call('HGET', P..'share:'..host, 'co')
  if co then redis.call('SREM', P..'coheld:'..co, host) end
  redis.call('DEL', P..'share:'..host)
  redis.call('ZREM', P..'offers', host)
  memo_shared[host] = false
  make_claimable(host)
end
-- The holder wants its part back: an offer nobody took ends now; a
-- co-holder stops, and ends the share once nothing of it is in flight.
local function recall(host)
  if not shared(host) then return end
  if redis.call('HEXISTS', P..'share:'..host, 'co') == 1 then
    redis.call('HSET', P..'share:'..host, 'recall', 1)
  else
    end_share(host)
  end
end
local function release(proc, host)
  if owner_of(host) ~= proc then return 0 end
  set_owner(host, false)
  redis.call('SREM', P..'held:'..proc, host)
  recall(host)
  if not shared(host) then make_claimable(host) end
  return 1
end
local function leave(proc)
  local n = 0
  for _, id in ipairs(redis.call('SMEMBERS', P..'lease:'..proc)) do
    n = n + give_back(proc, id)
  end
  for _, host in ipairs(redis.call('SMEMBERS', P..'held:'..proc)) do
    release(proc, host)
  end
  for _, host in ipairs(redis.call('SMEMBERS', P..'coheld:'..proc)) do
    if redis.call('HGET', P..'share:'..host, 'co') == proc then end_share(host) end
  end
  redis.call('DEL', P..'lease:'..proc, P..'held:'..proc, P..'coheld:'..proc)
  redis.call('ZREM', P..'procs', proc)
  redis.call('ZREM', P..'hungry', proc)
  redis.call('ZREM', P..'wantshare', proc)
  redis.call('HDEL', P..'backlog', proc)
  return n
end
-- The dupefilter (see the module's docstring): add a fingerprint, 1 if it
-- is new. Exact mode: linear hashing over the small hashes f:<n>.
local fp_mode, fp_level, fp_split, fp_count, fp_changed
local function fp_read()
  if not fp_mode then
    local s = redis.call('HMGET', P..'fp', 'mode', 'level', 'split', 'n')
    fp_mode = s[1] or 'exact'
    fp_level, fp_split = tonumber(s[2] or '0'), tonumber(s[3] or '0')
    fp_count = tonumber(s[4] or '0')
  end
end
local function fp_hash(f)
  local b1, b2, b3, b4 = string.byte(f, 1, 4)
  return ((b1 * 256 + b2) * 256 + b3) * 256 + b4
end
local function fp_index(f)
  local m = 2 ^ fp_level
  local h = fp_hash(f)
  local b = h %% m
  if b < fp_split then b = h %% (m * 2) end
  return string.format('%%.0f', b)
end
-- One bucket more: the next bucket in turn gives the fingerprints that
-- belong to the new one (a bucket holds well under 128 of them).
local function fp_grow()
  local m = 2 ^ fp_level
  local from = P..'f:'..string.format('%%.0f', fp_split)
  local all = redis.call('HGETALL', from)
  local moved, names = {}, {}
  for i = 1, #all, 2 do
    if fp_hash(all[i]) %% (m * 2) ~= fp_split then
      moved[#moved + 1] = all[i]
      moved[#moved + 1] = all[i + 1]
      names[#names + 1] = all[i]
    end
  end
  if #names > 0 then
    redis.call('HSET', P..'f:'..string.format('%%.0f', fp_split + m), unpack(moved))
    redis.call('HDEL', from, unpack(names))
  end
  fp_split = fp_split + 1
  if fp_split >= m then
    fp_level = fp_level + 1
    fp_split = 0
  end
end
local function fp_add(f, tag)
  fp_read()
  if fp_mode == 'bloom' then return redis.call('BF.ADD', P..'bloom', f) end
  if redis.call('HSETNX', P..'f:'..fp_index(f), f, tag) == 0 then return 0 end
  fp_count = fp_count + 1
  fp_changed = true
  if fp_count > %(load)d * (2 ^ fp_level + fp_split) then fp_grow() end
  return 1
end
-- Who pushed the fingerprint (exact mode; false in bloom mode).
local function fp_tag(f)
  fp_read()
  if fp_mode == 'bloom' then return false end
  return redis.call('HGET', P..'f:'..fp_index(f), f)
end
-- A command with the fixed arguments and the values, in chunks (Lua's unpack
-- takes a few thousand at most).
local function chunked(cmd, name, values)
  for i = 1, #values, 1000 do
    redis.call(cmd, P..name, unpack(values, i, math.min(i + 999, #values)))
  end
end
local function flush()
  for name, values in pairs(new_lists) do chunked('RPUSH', name, values) end
  if #new_values > 0 then chunked('HSET', 'r', new_values) end
  for proc, ids in pairs(new_leases) do chunked('SADD', 'lease:'..proc, ids) end
  if order_next then redis.call('SET', P..'order', order_next) end
  for host, d in pairs(qdelta) do
    if d ~= 0 and tonumber(redis.call('ZINCRBY', P..'qcount', d, host)) <= 0 then
      redis.call('ZREM', P..'qcount', host)
    end
  end
  for field, n in pairs(counters) do
    if n ~= 0 then redis.call('HINCRBY', P..'stats', field, n) end
  end
  if fp_changed then
    redis.call('HSET', P..'fp', 'level', fp_level, 'split', fp_split, 'n', fp_count)
  end
end
local function run(body)
  local result = body()
  flush()
  return result
end
return run(function()
""".replace("%(order)d", str(_ORDER))
    .replace("%(load)d", str(FP_LOAD))
    .replace("%(lost)s", LOST)
    .replace("%%", "%")
)
_END = """
end)
"""

#: ARGV: proc, then (id, fingerprint key or "", host, rank, keep, data) per
#: request, keep "1" or "0" and "r1" or "r0" for a request sent before in a
#: batch whose answer was lost. Per request: 0 a duplicate, 1 queued, 2
#: leased to *proc* (it holds the host and asked to keep it), 3 refused (host
#: given up). A request with a fingerprint is queued lean (``l:<host>:<rank>``),
#: one without by id (``b:<host>``).
PUSH = (
    _COMMON
    + """
local proc = ARGV[1]
local tag = string.match(proc, '%d+$') or '0'
local out = {}
local kept = {}
for i = 2, #ARGV, 6 do
  local id, fp, host, rank, keep = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local status
  local new
  if gave_up(host) then
    new = false
  elseif fp == '' then
    new = redis.call('HEXISTS', P..'r', id) == 0
  else
    new = fp_add(fp, tag) == 1
  end
  if not new then
    -- A request pushed already (its batch sent again after the answer was
    -- lost) answers as it did: kept and queued by id ones are in r, a lean
    -- one by its fingerprint's tag.
    if redis.call('HEXISTS', P..'r', id) == 1 then
      status = redis.call('SISMEMBER', P..'lease:'..proc, id) == 1 and 2 or 1
    elseif gave_up(host) then
      status = 3
    elseif string.sub(keep, 1, 1) == 'r' and fp_tag(fp) == tag then
      status = 1
    else
      status = 0
      hinc('duplicates', 1)
    end
  else
    hinc('pushed', 1)
    if string.sub(keep, -1) == '1' and owner_of(host) == proc then
      new_values[#new_values + 1] = id
      new_values[#new_values + 1] = rank..' '..host..'\\n'..ARGV[i + 5]
      kept[#kept + 1] = id
      hinc('leased', 1)
      status = 2
    elseif fp == '' then
      new_values[#new_values + 1] = id
      new_values[#new_values + 1] = rank..' '..host..'\\n'..ARGV[i + 5]
      enqueue(host, id, tonumber(rank))
      status = 1
    else
      enqueue_lean(host, rank, ARGV[i + 5])
      status = 1
    end
  end
  out[#out + 1] = status
end
if #kept > 0 then new_leases[proc] = kept end
return out
"""
    + _END
)

#: ARGV: proc, ids. Ends each lease (a request leased elsewhere since, after
#: this process lost it, is left to its new holder).
ACK = (
    _COMMON
    + """
pass_when_full()
local proc = ARGV[1]
local ids, listed = {}, {}
for i = 2, #ARGV do
  if not listed[ARGV[i]] then
    listed[ARGV[i]] = true
    ids[#ids + 1] = ARGV[i]
  end
end
if #ids == 0 then return 1 end
local mine = redis.call('SMISMEMBER', P..'lease:'..proc, unpack(ids))
local done = {}
for i, id in ipairs(ids) do
  if mine[i] == 1 then
    done[#done + 1] = id
  else
    local v = redis.call('HGET', P..'r', id)
    if v then
      local host = parse(v)
      if redis.call('ZREM', P..'b:'..host, id) == 1 then
        redis.call('HDEL', P..'r', id)
        hinc('queued', -1)
        hinc('acked', 1)
        qdelta[host] = (qdelta[host] or 0) - 1
      end
    end
  end
end
if #done > 0 then
  redis.call('SREM', P..'lease:'..proc, unpack(done))
  redis.call('HDEL', P..'r', unpack(done))
  hinc('leased', -#done)
  hinc('acked', #done)
end
return 1
"""
    + _END
)

#: ARGV: proc, host, state JSON ("" keeps it), ready ms, release "1"/"0",
#: then ids to give back. Saves the host's state; gives the ids back to the
#: queue; with release, the host goes back to the claimable ones.
GIVE_BACK = (
    _COMMON
    + """
pass_when_full()
local proc, host, state, ready, rel = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
if state ~= '' then redis.call('HSET', P..'state', host, state) end
if ready > 0 then
  redis.call('HSET', P..'ready', host, ready)
else
  redis.call('HDEL', P..'ready', host)
end
memo_ready[host] = ready > 0 and ready or 0
for i = 6, #ARGV do give_back(proc, ARGV[i]) end
if rel == '1' then release(proc, host) end
return 1
"""
    + _END
)

#: ARGV: proc, now ms, hosts wanted, requests per host, how long (ms) a
#: process that wanted hosts and found none counts as waiting (default
#: 2000), and "1" if the process may take a part of a busy host. Returns -1
#: if the process is not registered (its heartbeat expired), else {1 if it
#: now counts as waiting for hosts else 0, then per host claimed: {host,
#: state JSON, requests left queued, {id, value, ...}}, and for a part of a
#: shared host the same plus its part of the limit and its block (ms)}.
#:
#: While another process waits, a process claims only up to its fair share
#: (the hosts held or claimable now over the live processes, rounded up),
#: and none if it holds at least the share rounded down. A process waits
#: (``hungry``) when it found fewer hosts than it asked for and holds fewer
#: than that share rounded down.
CLAIM = (
    _COMMON
    + """
pass_when_full()
local proc, now, n, w = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local wait_ms = tonumber(ARGV[5] or '2000')
if not redis.call('ZSCORE', P..'procs', proc) then return -1 end
local held = redis.call('SCARD', P..'held:'..proc)
local live = math.max(1, redis.call('ZCOUNT', P..'procs', now, '+inf'))
local hosts_now = redis.call('HLEN', P..'owner') + redis.call('ZCOUNT', P..'avail', '-inf', now)
local low = math.floor(hosts_now / live)
local waiting = redis.call('ZCOUNT', P..'hungry', now - wait_ms, '+inf')
local mine = tonumber(redis.call('ZSCORE', P..'hungry', proc) or '-1')
if mine >= now - wait_ms then waiting = waiting - 1 end
if waiting > 0 then
  if held >= low then n = 0 else n = math.min(n, math.ceil(hosts_now / live) - held) end
end
local out = {0}
local got = 0
local ready = {}
if n > 0 then ready = redis.call('ZRANGEBYSCORE', P..'avail', '-inf', now, 'LIMIT', 0, n) end
for _, host in ipairs(ready) do
  redis.call('ZREM', P..'avail', host)
  if not owner_of(host) and not shared(host) and count_of(host) > 0 then
    set_owner(host, proc)
    redis.call('SADD', P..'held:'..proc, host)
    local items = take(proc, host, w)
    out[#out + 1] = {host, redis.call('HGET', P..'state', host) or '', count_of(host), items}
    got = got + 1
  end
end
hinc('claims', got)
if got == 0 and n > 0 and ARGV[6] == '1' then
  -- No host to claim whole: take the part a busy host's holder offers, if
  -- any (one co-holder per host), or say that this process wants one.
  local took = false
  for _, host in ipairs(redis.call('ZRANGE', P..'offers', 0, 3)) do
    local rec = redis.call('HMGET', P..'share:'..host, 'owner', 'grant', 'block')
    if rec[1] and rec[1] ~= proc and owner_of(host) == rec[1] then
      redis.call('ZREM', P..'offers', host)
      redis.call('HSET', P..'share:'..host, 'co', proc)
      redis.call('SADD', P..'coheld:'..proc, host)
      local items = take(proc, host, w)
      out[#out + 1] = {host, redis.call('HGET', P..'state', host) or '', count_of(host), items,
                       rec[2], rec[3] or '0'}
      hinc('shares', 1)
      took = true
      break
    end
  end
  if took then
    redis.call('ZREM', P..'wantshare', proc)
  else
    redis.call('ZADD', P..'wantshare', now, proc)
  end
elseif got > 0 then
  redis.call('ZREM', P..'wantshare', proc)
end
if got < n and held + got < low then
  redis.call('ZADD', P..'hungry', now, proc)
  out[1] = 1
else
  redis.call('ZREM', P..'hungry', proc)
end
return out
"""
    + _END
)

#: ARGV: proc, host, n. The next *n* requests of a host the process holds:
#: {left queued, {id, value, ...}}, or -1 if it does not hold the host.
REFILL = (
    _COMMON
    + """
pass_when_full()
local proc, host, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
if owner_of(host) ~= proc and redis.call('HGET', P..'share:'..host, 'co') ~= proc then
  return -1
end
local items = take(proc, host, n)
return {count_of(host), items}
"""
    + _END
)

#: ARGV: proc, now ms, expiry ms. Renews the heartbeat; reclaims what
#: processes whose heartbeat expired held. Returns {1 if *proc* was still
#: registered else 0, requests reclaimed}.
HEARTBEAT = (
    _COMMON
    + """
pass_when_full()
local proc, now, expiry = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local alive = redis.call('ZSCORE', P..'procs', proc) and 1 or 0
local n = 0
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', P..'procs', '-inf', now, 'LIMIT', 0, 8)) do
  if dead ~= proc then
    local k = leave(dead)
    hinc('reclaimed', k)
    n = n + k
  end
end
redis.call('ZADD', P..'procs', expiry, proc)
return {alive, n}
"""
    + _END
)

#: ARGV: proc, then the host count, hosts, then ids: what the process knows
#: it holds. Gives back leases and releases hosts it does not know of (their
#: claim or refill answer was lost with the connection). The other way, after
#: a failover to a replica that missed the last writes: a host it holds that
#: no process holds in Redis is its own again, and an id it holds that is
#: queued for a host it holds is leased to it again. Returns {ids given
#: back, {hosts another process holds now: the process drops them}}.
RESYNC = (
    _COMMON
    + """
pass_when_full()
local proc = ARGV[1]
local nh = tonumber(ARGV[2])
local hosts, ids, leased, lost = {}, {}, {}, {}
for i = 3, 2 + nh do hosts[ARGV[i]] = true end
for i = 3 + nh, #ARGV do ids[ARGV[i]] = true end
local n = 0
for _, id in ipairs(redis.call('SMEMBERS', P..'lease:'..proc)) do
  if ids[id] then leased[id] = true else n = n + give_back(proc, id) end
end
for _, host in ipairs(redis.call('SMEMBERS', P..'held:'..proc)) do
  if not hosts[host] then release(proc, host) end
end
for _, host in ipairs(redis.call('SMEMBERS', P..'coheld:'..proc)) do
  if not hosts[host] and redis.call('HGET', P..'share:'..host, 'co') == proc then
    end_share(host)
  end
end
local mine = {}
for i = 3, 2 + nh do
  local host = ARGV[i]
  local owner = owner_of(host)
  if owner == proc or redis.call('HGET', P..'share:'..host, 'co') == proc then
    mine[host] = true
  elseif not owner and not shared(host) and not gave_up(host) then
    set_owner(host, proc)
    redis.call('SADD', P..'held:'..proc, host)
    redis.call('ZREM', P..'avail', host)
    mine[host] = true
  else
    lost[#lost + 1] = host
  end
end
for i = 3 + nh, #ARGV do
  local id = ARGV[i]
  if not leased[id] then
    local v = redis.call('HGET', P..'r', id)
    if v then
      local host = parse(v)
      if mine[host] and redis.call('ZREM', P..'b:'..host, id) == 1 then
        redis.call('SADD', P..'lease:'..proc, id)
        hinc('queued', -1)
        hinc('leased', 1)
        qdelta[host] = (qdelta[host] or 0) - 1
      end
    end
  end
end
return {n, lost}
"""
    + _END
)

#: ARGV: proc, host, limit, part, now ms. The holder of a busy host offers
#: *part* of its *limit* to a process that finds no host to claim; it has
#: already lowered its own part to ``limit - part`` and has no more than that
#: in flight. Returns 1, or 0 if it does not hold the host (then nothing is
#: offered).
OFFER = (
    _COMMON
    + """
pass_when_full()
local proc, host, limit, part, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if owner_of(host) ~= proc or gave_up(host) then return 0 end
if shared(host) then return 1 end
redis.call('HSET', P..'share:'..host, 'owner', proc, 'limit', limit, 'grant', part, 'block', 0)
redis.call('ZADD', P..'offers', now, host)
return 1
"""
    + _END
)

#: ARGV: proc, host, role ("o" the holder, "c" the co-holder), block (ms, 0:
#: none), what to do ("", "recall" from the holder, "end" from a co-holder
#: with nothing of the host in flight), then ids the co-holder gives back.
#: Keeps the latest block either holder saw. Returns {0 if the share is over
#: (or not this process's), 1 if offered and not taken, 2 if co-held; the
#: block (ms); 1 if the holder recalled it}.
SHARE = (
    _COMMON
    + """
pass_when_full()
local proc, host, role, block, what = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local key = P..'share:'..host
for i = 6, #ARGV do give_back(proc, ARGV[i]) end
local rec = redis.call('HMGET', key, 'owner', 'co', 'block', 'recall')
local mine = (role == 'o' and rec[1] == proc) or (role == 'c' and rec[2] == proc)
if not mine then return {0, 0, 1} end
local b = tonumber(rec[3] or '0')
if block > b then
  b = block
  redis.call('HSET', key, 'block', b)
end
if what == 'end' then
  end_share(host)
  return {0, b, 1}
end
if what == 'recall' then
  recall(host)
  if not shared(host) then return {0, b, 1} end
  return {2, b, 1}
end
return {rec[2] and 2 or 1, b, rec[4] and 1 or 0}
"""
    + _END
)

#: ARGV: proc. Gives back everything the process holds and unregisters it.
LEAVE = (
    _COMMON
    + """
pass_when_full()
return leave(ARGV[1])
"""
    + _END
)

#: ARGV: host. Refuses the host's requests from now on and drops those queued.
GIVE_UP = (
    _COMMON
    + """
pass_when_full()
local host = ARGV[1]
redis.call('SADD', P..'gaveup', host)
for _, rank in ipairs(redis.call('ZRANGE', P..'q:'..host, 0, -1)) do
  redis.call('DEL', P..'l:'..host..':'..rank)
end
for _, id in ipairs(redis.call('ZRANGE', P..'b:'..host, 0, -1)) do
  redis.call('HDEL', P..'r', id)
end
local n = count_of(host)
qdelta[host] = nil
redis.call('DEL', P..'q:'..host, P..'b:'..host)
redis.call('ZREM', P..'qcount', host)
redis.call('ZREM', P..'avail', host)
hinc('queued', -n)
hinc('refused', n)
return n
"""
    + _END
)

#: ARGV: proc, n. How many requests the process keeps back while Redis is
#: full (0: none).
BACKLOG = (
    _COMMON
    + """
pass_when_full()
local proc, n = ARGV[1], tonumber(ARGV[2])
if n > 0 then
  redis.call('HSET', P..'backlog', proc, n)
else
  redis.call('HDEL', P..'backlog', proc)
end
return 1
"""
    + _END
)

SCRIPTS = {
    "push": PUSH,
    "ack": ACK,
    "give_back": GIVE_BACK,
    "claim": CLAIM,
    "refill": REFILL,
    "heartbeat": HEARTBEAT,
    "resync": RESYNC,
    "leave": LEAVE,
    "give_up": GIVE_UP,
    "offer": OFFER,
    "share": SHARE,
    "backlog": BACKLOG,
}


def split_value(value: bytes) -> tuple[str, int, bytes]:
    """``(host, rank, data)`` of a request's value in the ``r`` hash."""
    head, _, data = value.partition(b"\n")
    rank, _, host = head.partition(b" ")
    return host.decode(), int(rank), data


def fingerprint_key(fingerprint: bytes) -> bytes:
    """Return what the dupefilter keeps of a request's *fingerprint*.

    Its first :data:`FP_BYTES` bytes when it is a digest (Scrapy's are
    20-byte SHA1s), else (a shorter one, any bytes) an 8-byte digest of it.
    """
    if len(fingerprint) >= 16:
        return fingerprint[:FP_BYTES]
    return hashlib.blake2b(fingerprint, digest_size=FP_BYTES).digest()


#: The Bloom filter's first size (fingerprints) over all the partitions; it
#: grows by sub-filters of twice the size each (``BF.RESERVE ... EXPANSION 2``).
BLOOM_CAPACITY = 10_000_000
#: The least a partition's Bloom filter starts with.
BLOOM_CAPACITY_MIN = 100_000


def _dupefilter(client: Any, p: str, bloom: float | None, partitions: int = 1) -> None:
    """Make the partition's dupefilter as asked, or refuse one made otherwise.

    *bloom* is the error rate of a Bloom filter, 0 exact fingerprints, None
    whatever the crawl has; a crawl made with the other one is refused.
    """
    mode = client.hget(p + "fp", "mode")
    if mode is None and bloom is not None:
        if bloom > 0:
            capacity = max(BLOOM_CAPACITY_MIN, BLOOM_CAPACITY // partitions)
            client.execute_command("BF.RESERVE", p + "bloom", bloom, capacity, "EXPANSION", 2)
        client.hsetnx(p + "fp", "mode", "bloom" if bloom > 0 else "exact")
        mode = client.hget(p + "fp", "mode")
    if mode is None or bloom is None:
        return
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode != ("bloom" if bloom > 0 else "exact"):
        kept, setting = (
            ("exact", "0") if mode == "exact" else ("in a Bloom filter", "its error rate")
        )
        raise RedisFrontierError(
            f"this crawl's fingerprints are {kept}: set HOSTQUEUE_REDIS_BLOOM_ERROR_RATE to "
            f"{setting} to join it, or choose another HOSTQUEUE_CRAWL_ID"
        )


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


def suffixes_for(
    crawl_id: str, count: int, master_of: Callable[[str], Any] | None = None
) -> list[str]:
    """Choose the suffixes of *count* partitions of a new crawl.

    ``0`` to ``count - 1`` on one server. On a Redis Cluster, *master_of*
    names the master serving a key: partition *k* goes to the master ``k %
    masters`` (the masters in the order of their first partition's), its
    suffix ``k`` or the first ``k.1``, ``k.2``... whose slot that master
    serves, so that the partitions are dealt evenly over the masters.
    """
    if master_of is None or count == 1:
        return [str(k) for k in range(count)]
    masters: list[Any] = []
    for k in range(64 * count):  # every master met (each serves about 1/masters of the slots)
        master = master_of(part_prefix(crawl_id, f"m{k}"))
        if master not in masters:
            masters.append(master)
    out = []
    for k in range(count):
        wanted = masters[k % len(masters)]
        suffix = str(k)
        for n in range(1, 100_000):
            if master_of(part_prefix(crawl_id, suffix)) == wanted:
                break
            suffix = f"{k}.{n}"
        out.append(suffix)
    return out


def open_crawl(
    client: Any,
    crawl_id: str,
    bloom: float | None = None,
    *,
    partitions: int | None = None,
    master_of: Callable[[str], Any] | None = None,
) -> str:
    """Check the layout of *crawl_id*, make the crawl if it is not there.

    Check the layout of *crawl_id* with a synchronous *client*, make the
    crawl if it is not there (its partitions: *partitions* of them, 1 if
    None, placed with *master_of* on a Redis Cluster, see
    :func:`suffixes_for`; its identity in each; its dupefilter: see
    :func:`_dupefilter` for *bloom*; then its layout version), and return its
    identity. A crawl that exists keeps the partitions it was made with.
    Raises :class:`RedisFrontierError`.
    """
    home = prefix(crawl_id)
    version = _text(client.get(home + "version"))
    if version is not None and version != LAYOUT_VERSION:
        raise RedisFrontierError(
            f"crawl id {crawl_id!r} on this Redis was written with frontier layout "
            f"{version}, this scrapy-hostqueue uses layout {LAYOUT_VERSION}: finish it with "
            "the version that wrote it, or choose another HOSTQUEUE_CRAWL_ID"
        )
    if version is None:
        # Made now (or completed, if a process stopped while making it):
        # every step keeps what is there already.
        count = partitions or 1
        client.set(home + "partitions", " ".join(suffixes_for(crawl_id, count, master_of)), nx=True)
    prefixes = partition_prefixes(client, crawl_id)
    if version is None:
        # The first partition's token is the crawl's: processes making the
        # crawl at once copy the same one into the others.
        client.set(prefixes[0] + "crawl", secrets.token_hex(8), nx=True)
        token = _text(client.get(prefixes[0] + "crawl"))
        for p in prefixes[1:]:
            client.set(p + "crawl", token, nx=True)
    tokens = [_text(client.get(p + "crawl")) for p in prefixes]
    if tokens[0] is None or tokens.count(tokens[0]) != len(tokens):
        lost = [k for k, token in enumerate(tokens) if token != tokens[0] or token is None]
        raise RedisFrontierError(
            f"crawl id {crawl_id!r} on this Redis has lost {len(lost)} of its "
            f"{len(prefixes)} partitions (a master of a Redis Cluster restarted without "
            "its data, or its keys were deleted): choose another HOSTQUEUE_CRAWL_ID, and "
            "queue the crawl's requests there"
        )
    for p in prefixes:
        _dupefilter(client, p, bloom, len(prefixes))
    if version is None:
        client.set(home + "version", LAYOUT_VERSION, nx=True)
    return tokens[0]


def partition_prefixes(client: Any, crawl_id: str) -> list[str]:
    """Return the key prefixes of the partitions of *crawl_id*, in order.

    Read from the crawl's home with the synchronous *client*; raises
    :class:`RedisFrontierError` if the crawl is not there.
    """
    suffixes = _suffixes(client, crawl_id)
    if not suffixes:
        raise RedisFrontierError(f"crawl id {crawl_id!r} is not on this Redis")
    return [part_prefix(crawl_id, suffix) for suffix in suffixes]


def stored_partitions(client: Any, crawl_id: str) -> int | None:
    """Return how many partitions *crawl_id* has, None if it is not made yet."""
    return len(_suffixes(client, crawl_id)) or None


def _suffixes(client: Any, crawl_id: str) -> list[str]:
    """Return the suffixes of *crawl_id*'s partitions as its home keeps them (none yet: [])."""
    stored = _text(client.get(prefix(crawl_id) + "partitions"))
    return stored.split() if stored else []


def register(
    client: Any,
    crawl_id: str,
    expiry_ms: int,
    bloom: float | None = 0.0,
    *,
    partitions: int | None = None,
    master_of: Callable[[str], Any] | None = None,
) -> str:
    """Join *crawl_id* and return this process's id.

    Join *crawl_id* (see :func:`open_crawl` for *bloom*, *partitions* and
    *master_of*) with a synchronous *client* (at start-up, before the crawl
    runs): register this process in every partition and return its id.
    Raises :class:`RedisFrontierError`.
    """
    open_crawl(client, crawl_id, bloom, partitions=partitions, master_of=master_of)
    proc = _text(client.eval(_JOIN, 1, prefix(crawl_id), ""))
    for p in partition_prefixes(client, crawl_id):
        client.eval(_JOIN, 1, p, proc, expiry_ms)
    return str(proc)


#: KEYS: a prefix; ARGV: "" for a new process id (in the crawl's home), else
#: the process id and its heartbeat expiry (in a partition). It runs when
#: Redis is full (a process may join a full crawl).
_JOIN = """
redis.call('DEL', KEYS[1]..'none')
if ARGV[1] == '' then
  return tostring(redis.call('INCR', KEYS[1]..'procseq'))
end
redis.call('ZADD', KEYS[1]..'procs', ARGV[2], ARGV[1])
return ARGV[1]
"""


def crawl_token(client: Any, crawl_id: str) -> str:
    """Return the identity of *crawl_id*, which a process gives every script.

    The identity of *crawl_id* on the Redis of the synchronous *client*
    (written by :func:`open_crawl`): what a process gives every script.
    """
    token = _text(client.get(partition_prefixes(client, crawl_id)[0] + "crawl"))
    if token is None:
        raise RedisFrontierError(
            f"crawl id {crawl_id!r} vanished from Redis as this process joined it"
        )
    return token


__all__ = [
    "FP_BYTES",
    "FP_COST",
    "LAYOUT_VERSION",
    "LOST",
    "QUEUED_BYTES",
    "RANK_LIMIT",
    "SCRIPTS",
    "RedisFrontierError",
    "crawl_token",
    "fingerprint_key",
    "open_crawl",
    "part_prefix",
    "partition_of",
    "partition_prefixes",
    "prefix",
    "register",
    "split_value",
    "stored_partitions",
    "suffixes_for",
]
