"""What pairreg says to, and hears from, the tools around it: outgoing Standard
Webhooks and MLflow registry webhooks.
"""
