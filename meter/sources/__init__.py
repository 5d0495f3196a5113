"""Software power counters as meter sources: RAPL, hwmon, NVML and the Raspberry Pi 5 PMIC.

One module per device family (``rapl``, ``hwmon``, ``nvml``, ``pmic``) beside ``common`` (the
abstract ``PowerSource``, its channel description, and ``NullSource`` for "no meter here"),
``counters`` (raw counter → trace rows and events: wrap, backwards, frozen, failing reads),
``recorder`` (one polling thread per source writing into a ``TraceWriter``) and ``factory``
(``--source auto`` / ``rapl,nvml,...`` → opened sources). Standard library only, like the rest
of meter/: these run on the meter machine or the inference host without pandas.

Every channel these sources write is *component* power (a CPU package, DRAM, a GPU, the Pi's
PMIC rails), never wall power: the power supply's losses and everything the counters do not
cover are missing. docs/sources.md says what each one sees.
"""
