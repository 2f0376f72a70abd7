"""The room of the store: every world-wide step of a cycle goes through the one store a world
shares, at O(1) store operations per rank.

``channel`` says who takes part, through which store, with what timeout, and writes the holder's
rounds; ``rounds`` is the protocol (a sync, an agreement, an exchange), ``entries`` how a round
lays out its keys, ``failures`` and ``stalled`` what a round that could not complete tells each
rank; ``sweep`` and ``written`` delete what creations leave in the store. ``rounds``,
``entries``, ``failures``, ``stalled`` and ``sweep`` import no torch.
"""
