"""Many devices, one edge: decoded tables re-priced as a discrete-event simulation of N devices
that share one uplink band and one batching edge server (methods §10); torch-free.

``batchprofile`` (the edge's batched forwards: interleaved repeats, medians, isotonic fit,
outliers re-timed), ``edge`` (batched service times, what a batch costs, the batching policy),
``uplink`` (how devices share the band), ``workload`` (decoded tables -> each device's legs of
local work, uplink transmissions, prefills and edge requests on its own fading stream),
``devices`` (which prompts, channel and draws each device has in a replicate), ``simulate``
(the event queue), ``sweep`` (every replicate, policy, scheme and device count of one method),
``job`` (one workflow job's inputs to a sweep), ``summary`` (intervals over replicates,
headline), ``capacity`` (knee, peak, service level, ranking, crossovers) and ``report`` (the
report's text and tables).
"""
