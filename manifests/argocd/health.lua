-- Argo CD health of a dbq Queue (resource.customizations.health.dbq.dev_Queue), from the
-- conditions dbq writes by the kstatus convention:
--   Progressing  not reconciled yet, a new generation being worked on, or being deleted
--   Healthy      Ready=True
--   Degraded     Stalled=True (a change is needed), or a provisioned queue that is no longer Ready
--   Suspended    paused with the dbq.dev/paused annotation
local hs = {status = "Progressing", message = "waiting for the dbq operator to see this queue"}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c)
  return (c.reason or "") .. ": " .. (c.message or "")
end

if obj.metadata.deletionTimestamp ~= nil then
  local blocked = condition("DeletionBlocked")
  hs.message = "deleting: dbq removes the queue's database objects as its deletion policy says"
  if blocked ~= nil and blocked.status == "True" then
    hs.message = "deleting, blocked: " .. said(blocked)
  end
  return hs
end

local annotations = obj.metadata.annotations or {}
if annotations["dbq.dev/paused"] == "true" then
  hs.status = "Suspended"
  hs.message = "paused by the dbq.dev/paused annotation: dbq leaves this queue alone"
  return hs
end

if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "waiting for the dbq operator to observe generation " .. generation
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = said(stalled)
  return hs
end

local ready = condition("Ready")
local reconciling = condition("Reconciling")
if ready ~= nil and ready.status == "True" then
  if reconciling ~= nil and reconciling.status == "True" then
    hs.message = said(reconciling)  -- a new generation is being applied to a working queue
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message or "ready"
  return hs
end

local provisioned = condition("Provisioned")
if ready ~= nil and ready.status == "False" and provisioned ~= nil and provisioned.status == "True" then
  hs.status = "Degraded"  -- it worked before: an outage, not a queue still being made
  hs.message = said(ready)
  return hs
end
if ready ~= nil then
  hs.message = said(ready)
end
return hs
