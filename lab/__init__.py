"""The network lab: a two-datacenter topology in network namespaces, with faults and WAN delay."""
