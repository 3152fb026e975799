"""The typed records services return and the API serialises, one module per area, so
the CLI renders the same shape embedded and remote.
"""
