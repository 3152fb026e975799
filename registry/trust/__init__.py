"""The audit log and everything that lets an outsider check it: the RFC 6962 tree,
C2SP signed notes and witnesses, offline bundle verification, and the signatures on
measurements and models.
"""
