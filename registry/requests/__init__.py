"""Request tags: their compact encoding, the store and its partitions, and the archive
that keeps old partitions verifiable.
"""
