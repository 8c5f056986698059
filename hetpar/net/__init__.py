"""The network layer: link kinds, topology levels, collective algorithms, contention."""
