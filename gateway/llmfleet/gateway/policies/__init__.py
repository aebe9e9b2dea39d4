"""Traffic policies: stages every request passes through between parsing and the engines.

Each policy is a `Stage` (see `base`): it reads its settings from the service's `spec.traffic`
(`call.service.traffic`) and either passes the call on (`await next(call)`) or answers it
itself. The order, outermost first, is fixed by `STAGES` in `app.py`:

    timeout     per-caller deadline; a stream that reaches it ends with finish_reason "length"
    debounce    a newer request of the same session supersedes the older one (409)
    coalesce    identical requests share one upstream call (streams fanned out)
    priority    admission by priority class; sheddable traffic degraded or shed under load
    cascade     cheap tiers first, escalating on low confidence
    (forward)   the engines: unified, or prefill then decode

A stage whose policy is off for the service costs one attribute check.
"""
