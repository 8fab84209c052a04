"""Many devices, one edge: decoded tables re-priced as a discrete-event simulation of N devices
that share one uplink band and one batching edge server (methods §10); torch-free.

``edge`` (batched service times, the batching policy), ``uplink`` (how devices share the band),
``workload`` (decoded tables -> each device's timeline of local work, uplink transmissions and
edge requests, on the prompts' own fading streams), ``simulate`` (the event queue), ``sweep``
(every device count and fading seed of one method) and ``summary`` (intervals over fading seeds,
saturation, headline).
"""
