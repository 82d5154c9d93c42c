"""The buyer's side of a tender: bundles, keys, verification, audit reruns and the
ranking of bidders (docs/tender.md). Everything here reads a vendor's files as
data, through the strict bounded readers, and runs nothing they name."""
