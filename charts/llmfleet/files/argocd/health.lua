-- Argo CD health check for llmfleet.dev/InferenceService (resource.customizations.health.
-- llmfleet.dev_InferenceService). Argo CD runs it with gopher-lua (Lua 5.1) and `obj` set to
-- the live object; it returns {status = Healthy|Progressing|Degraded|Suspended, message}.
--
-- Read in this order, the first that applies wins:
--   1. no status yet                                   -> Progressing (the operator has not run)
--   2. Degraded=True for this generation               -> Degraded (InvalidSpec, ApplyFailed,
--                                                         InsufficientGPU, CanaryRolledBack, ...)
--   3. status.observedGeneration < metadata.generation -> Progressing (a newer spec is not acted on)
--   4. a canary paused                                 -> Suspended (waits for the resume annotation)
--   5. CanaryInProgress=True                           -> Progressing (weight and step in the message)
--   6. Ready=True                                      -> Healthy (every pool serves its target)
--   7. Ready=False reason ScaledToZero                 -> Suspended (replicas 0 or the autoscaler's 0)
--   8. anything else                                   -> Progressing with Ready's reason and message
-- A Degraded condition written for an older generation is skipped at step 2: the operator has
-- not yet looked at the spec that may have fixed it, so step 3 says Progressing instead.
-- This mirrors operator/llmfleet/operator/conditions.py; tests/chart/test_argocd_health.py runs
-- it with a real Lua 5.1 interpreter on sample statuses.

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c)
  local reason = c.reason or ""
  local message = c.message or ""
  if reason ~= "" and message ~= "" then
    return reason .. ": " .. message
  end
  return reason .. message
end

local function health(o)
  local status = o.status
  if status == nil or status.conditions == nil or #status.conditions == 0 then
    return {status = "Progressing", message = "Waiting for the llmfleet operator to report status"}
  end
  local generation = o.metadata and o.metadata.generation or nil

  local degraded = condition(status, "Degraded")
  if degraded ~= nil and degraded.status == "True" and
      (degraded.observedGeneration == nil or generation == nil or
       degraded.observedGeneration == generation) then
    return {status = "Degraded", message = said(degraded)}
  end

  local observed = status.observedGeneration
  if generation ~= nil and (observed == nil or observed < generation) then
    local seen = "no generation yet"
    if observed ~= nil then
      seen = string.format("generation %d", observed)
    end
    return {
      status = "Progressing",
      message = string.format(
        "Waiting for the operator to act on generation %d (status describes %s)", generation, seen)
    }
  end

  local canary = status.canary
  if canary ~= nil and canary.phase == "Paused" then
    return {
      status = "Suspended",
      message = string.format("Canary paused at step %d, weight %d%%", canary.step or 0,
                              canary.weight or 0)
    }
  end
  local rollout = condition(status, "CanaryInProgress")
  if rollout ~= nil and rollout.status == "True" then
    return {status = "Progressing", message = said(rollout)}
  end

  local ready = condition(status, "Ready")
  if ready ~= nil and ready.status == "True" then
    return {status = "Healthy", message = said(ready)}
  end
  if ready ~= nil and ready.reason == "ScaledToZero" then
    return {status = "Suspended", message = said(ready)}
  end
  if ready ~= nil then
    return {status = "Progressing", message = said(ready)}
  end
  return {status = "Progressing", message = "Waiting for the Ready condition"}
end

return health(obj)
