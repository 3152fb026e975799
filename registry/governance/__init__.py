"""The rules that govern pairs: policies, duties and roles, the pair lifecycle, and
which pair a deployment served at an instant.
"""
