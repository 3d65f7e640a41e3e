"""How far simtrain's figures have been off where they could be checked: the margins a result is read with."""

#: how far the memory ledger's peak has been off where a peak was measured: +7.8%, the larger of the two measured
#: peaks in `simtrain validate` (torchtitan Llama 3 8B on H100, peak reserved memory: predicted 88.8 GiB against
#: 82.4 measured, +7.8%; 70.7 against 67.0, +5.5%; docs/model.md, "Memory, where the source measured it"). A layout
#: whose headroom is smaller than this may not fit; `search` keeps this much free by default.
LEDGER_ERROR = 0.078
