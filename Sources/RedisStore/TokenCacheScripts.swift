import Redis

/// The token cache's Lua scripts: each runs on one user's keys (`TokenCache.onUser`) or one Live Activity's, atomic
/// where a check and a change must not be parted.
extension TokenCache {
    /// How long a user's dated removals are remembered (s): events arrive out of order by far less.
    static let removalLifetime = 7 * 24 * 3600

    /// Forgets one token of the user whose keys are KEYS[1] (tokens), KEYS[2] (registered), KEYS[3] (devices).
    static let forgetFunction = """
        local function forget(token)
          redis.call('HDEL', KEYS[1], token)
          redis.call('HDEL', KEYS[2], token)
          redis.call('HDEL', KEYS[3], token)
        end

        """

    /// Atomic per user, so a registration landing between the check and the delete cannot be lost. Every spelling of
    /// the token in the user's entry goes (other systems may have written one in upper case): each is judged as one.
    /// ARGV: token, died-at ms (-1: unconditionally), then the cache values the entry must hold to be removed (none:
    /// any). Returns {1 if a token was removed else 0, then the spellings forgotten, whose owner key may name the
    /// user}. A dated removal is remembered (KEYS[4], `removalLifetime`), whether the token was there or not yet: a
    /// registration from before it that arrives later is older news.
    static let removeUnlessRegisteredAfter =
        forgetFunction + """
            local wanted = string.lower(ARGV[1])
            local died = tonumber(ARGV[2])
            local result = {0}
            local function removeOne(token)
              local registered = tonumber(redis.call('HGET', KEYS[2], token) or '0') or 0
              if died >= 0 and registered > died then return end
              local value = redis.call('HGET', KEYS[1], token)
              if value and #ARGV > 2 then
                local serves = false
                for index = 3, #ARGV do if ARGV[index] == value then serves = true end end
                if not serves then return end
              end
              if died >= 0 and #KEYS >= 4 then
                local before = tonumber(redis.call('HGET', KEYS[4], token) or '0') or 0
                if died > before then redis.call('HSET', KEYS[4], token, died) end
                redis.call('EXPIRE', KEYS[4], \(removalLifetime))
              end
              forget(token)
              if value then result[1] = 1 end
              table.insert(result, token)
            end
            local spellings = {}
            for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
              if string.lower(field) == wanted then table.insert(spellings, field) end
            end
            if #spellings == 0 then spellings = {ARGV[1]} end
            for _, token in ipairs(spellings) do removeOne(token) end
            return result
            """

    /// A token leaving its previous owner for another user: forgotten there, every spelling of it (another system
    /// may have written it in upper case), unless that owner registered it after this registration (events can
    /// arrive out of order). ARGV: token, registered-at ms. Returns 1 if forgotten (or not there), -1 if the previous
    /// owner's registration is newer.
    static let leavePreviousOwner =
        forgetFunction + """
            local wanted = string.lower(ARGV[1])
            local spellings = {ARGV[1]}
            for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
              if field ~= ARGV[1] and string.lower(field) == wanted then table.insert(spellings, field) end
            end
            for _, token in ipairs(spellings) do
              local known = tonumber(redis.call('HGET', KEYS[2], token) or '0') or 0
              if known > tonumber(ARGV[2]) then return -1 end
            end
            for _, token in ipairs(spellings) do forget(token) end
            return 1
            """

    /// A registration newer than what the user's keys know (re)writes the token; an older one changes nothing.
    /// ARGV: token, cache value (`TokenScope`), registered-at ms, device JSON or "". Returns 1 if applied.
    /// A removal (a logout, a 410) newer than the registration counts as known too (KEYS[4], a user's only).
    static let registerFunction = """
        local function registerToken()
          local known = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') or 0
          if #KEYS >= 4 then
            local removed = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0') or 0
            if removed > known then known = removed end
          end
          if known > tonumber(ARGV[3]) then return 0 end
          redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
          redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
          if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[4]) end
          return 1
        end

        """
    static let register = registerFunction + "return registerToken()"
    /// `register` on a Live Activity's keys; one that applies gives the activity's keys its lifetime again (ARGV[5],
    /// seconds), an older one changes nothing, not even that.
    static let registerUnderActivity =
        registerFunction + """
            local applied = registerToken()
            if applied == 1 then
              redis.call('EXPIRE', KEYS[1], ARGV[5])
              redis.call('EXPIRE', KEYS[2], ARGV[5])
            end
            return applied
            """

    /// Removes every token of one user last registered before a cutoff. ARGV: cutoff ms. Returns the tokens removed.
    /// Tokens with no registration time, or one that is not milliseconds since September 2001 (another system's
    /// writing: text, or seconds, which would make every registration look decades old), are kept: their age is
    /// unknown.
    static let sweepUser =
        forgetFunction + """
            local cutoff = tonumber(ARGV[1])
            local entries = redis.call('HGETALL', KEYS[2])
            local removed = {}
            for index = 1, #entries, 2 do
              local registered = tonumber(entries[index + 1])
              if registered and registered >= 1000000000000 and registered < cutoff then
                forget(entries[index])
                table.insert(removed, entries[index])
              end
            end
            return removed
            """

    /// Writes copied tokens unless this user's keys know the same or a newer registration (or, for a token with no
    /// registration time, already hold it). ARGV: per token, token, cache value, registered-at ms or "", device JSON
    /// or "". Returns the tokens written.
    static let copyEntries = """
        local written = {}
        for index = 1, #ARGV, 4 do
          local token, at = ARGV[index], ARGV[index + 2]
          local known = redis.call('HGET', KEYS[2], token)
          local same = known == false and at == '' and redis.call('HGET', KEYS[1], token) == ARGV[index + 1]
          local newer = known and (at == '' or (tonumber(known) or 0) >= (tonumber(at) or 0))
          if not (newer or same) then
            redis.call('HSET', KEYS[1], token, ARGV[index + 1])
            if at ~= '' then redis.call('HSET', KEYS[2], token, at) end
            if ARGV[index + 3] ~= '' then redis.call('HSET', KEYS[3], token, ARGV[index + 3]) end
            table.insert(written, token)
          end
        end
        return written
        """

    /// Deletes a token's owner key only if it still names the user. KEYS[1]: the owner key; ARGV: user.
    static let releaseOwner = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """
}
